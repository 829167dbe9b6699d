"""The MLflow view of the grid (calibrl.tracking, calibrl.report.mlflow_view) on a real SQLite store:
idempotent over repeated aggregations, and a missing, locked or corrupted store fails clearly without
touching any result file."""

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from conftest import fake_run_results, filled
from mlflow.tracking import MlflowClient

from calibrl import grid as G
from calibrl.report.jobs import aggregate_job
from calibrl.report.mlflow_view import sync_grid_mlflow
from calibrl.tracking import Store, StoreError

RUNS = [("qwen3-tiny-m", "grpo", 0), ("qwen3-tiny-m", "iac", 0), ("qwen3-tiny-m", "grpo", 1)]


@pytest.fixture
def results(tmp_path):
    """A results folder as the workflow leaves it: per-checkpoint evaluations, training metrics, tables."""
    config = filled("config")
    grid = config["grid"]
    grid["methods"] = {m: G.method(config, m).to_dict() for m in grid["methods"]}  # compiled, as grid_mlflow's
    grid["models"] = {"qwen3-tiny-m": grid["models"]["qwen3-tiny-m"]}
    grid["seed"] = 0  # the fake runs' main seed
    grid["tables"] = {"table2_3": ["grpo", "iac"], "table4": ["iac"], "table5": ["grpo", "iac"], "figure6": []}
    res = tmp_path / "results"
    evals, metrics = fake_run_results(res, RUNS, k=8, splits=("test", "ood"))
    aggregate_job(grid, evals, metrics, str(res), str(res / "aggregate.json"))
    return grid, evals, metrics, res


def sync(results, **kw):
    grid, evals, metrics, res = results
    return sync_grid_mlflow(grid, evals, metrics, str(res), str(res / "mlflow"), "calibrl-test", **kw)


def digests(res):
    return {
        p: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in res.rglob("*")
        if p.is_file() and "mlflow" not in p.relative_to(res).parts
    }


def test_three_aggregations_leave_one_run_per_key_and_no_duplicate_point(results):
    res = results[3]
    first = sync(results, runs_json=str(res / "mlflow_runs.json"))
    sync(results)
    sync(results)
    client = MlflowClient(tracking_uri=f"sqlite:///{res / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("calibrl-test-grid")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    # only training runs in the grid's experiment (no pseudo-run in its charts), named so a table reads by method
    assert sorted(r.info.run_name for r in runs) == sorted(f"{me} s{s} ({m})" for m, me, s in RUNS)
    assert {r.data.tags["part"] for r in runs} == {"grid"}
    report = client.get_experiment_by_name("calibrl-test-claims")
    others = client.search_runs([report.experiment_id], max_results=100)
    assert "tables and figures" in {r.info.run_name for r in others}
    claims = [r for r in others if r.data.tags.get("part") == "claims"]
    assert claims and all(r.data.tags["verdict"] == "inconclusive" for r in claims)  # one seed per arm
    iac = [r for r in runs if r.data.tags.get("method") == "iac"][0]
    assert len(client.get_metric_history(iac.info.run_id, "eval/test/avg_at_8")) == 2
    assert len(client.get_metric_history(iac.info.run_id, "train/entropy")) == 50
    assert iac.data.tags["alpha"] == "1.0" and iac.data.tags["table"] == "table2_3,table4,table5"
    assert iac.data.params["grid.train.lr"] == "0.0003" and iac.data.params["iac_alpha"] == "1.0"
    seeds = sorted(r.data.tags["seed"] for r in runs if r.data.tags.get("method") == "grpo")
    assert seeds == ["0", "1"]
    # lean: the run's own settings and files, not the grid's other methods, tables or the aggregate figures
    assert not any(k.startswith(("grid.methods", "grid.tables", "grid.models")) for k in iac.data.params)
    assert len(iac.data.params) < 80, len(iac.data.params)
    assert {a.path for a in client.list_artifacts(iac.info.run_id, "run")} == {"run/metrics.jsonl"}
    assert not client.list_artifacts(iac.info.run_id, "tables") and not client.list_artifacts(
        iac.info.run_id, "figures"
    )
    tables = next(r for r in others if r.info.run_name == "tables and figures")
    assert {a.path for a in client.list_artifacts(tables.info.run_id, "tables")} >= {"tables/table2_vs_paper.md"}
    assert json.loads((res / "mlflow_runs.json").read_text())["runs"] == first
    assert {r.info.run_id for r in runs + others} == set(first.values())  # reused, never recreated
    links = json.loads((res / "mlflow_runs.json").read_text())["open"]
    assert links["grid"].endswith(f"/experiments/{exp.experiment_id}?workflowType=machine_learning")


def test_the_claims_are_listed_as_claims_csv_orders_them_primaries_first(results):
    """MLflow's runs table lists the newest first: the claims' runs come in claims.csv's order, then the tables."""
    res = results[3]
    sync(results)
    client = MlflowClient(tracking_uri=f"sqlite:///{res / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("calibrl-test-claims")
    listed = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=500)
    claims = pd.read_csv(res / "claims.csv")
    assert [r.data.params.get("claim") for r in listed] == [*claims["claim"], None]
    assert listed[-1].info.run_name == "tables and figures"


def test_corrupted_store_fails_clearly_and_keeps_results(results):
    res = results[3]
    before = digests(res)
    (res / "mlflow").mkdir()
    (res / "mlflow" / "mlflow.db").write_bytes(b"not a database " * 64)
    with pytest.raises(StoreError, match=r"mlflow\.db is corrupted .*move the store aside"):
        sync(results)
    assert digests(res) == before
    assert (res / "mlflow" / "mlflow.db").read_bytes() == b"not a database " * 64  # not "repaired" behind our back


def test_locked_store_fails_clearly_and_keeps_results(results):
    res = results[3]
    Store(res / "mlflow")  # a real, empty store
    before = digests(res)
    other = sqlite3.connect(res / "mlflow" / "mlflow.db")
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the lock
    try:
        with pytest.raises(StoreError, match="is locked by another process"):
            Store(res / "mlflow", lock_timeout=0.2)
    finally:
        other.rollback()
        other.close()
    assert digests(res) == before


def test_missing_store_is_an_error_for_readers_and_created_for_the_writer(results, tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store(tmp_path / "nowhere", must_exist=True)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match="is a file, not a folder"):
        Store(tmp_path / "afile")
    assert sync(results)  # the writer builds a missing store from the result files


def test_a_run_carries_the_trainings_real_start_and_end(tmp_path):
    """The run's start and end in MLflow are the training's (from metrics.jsonl's wall clock), not the sync's;
    a retrained run (other times) replaces the stored one."""
    from calibrl.tracking import RunRecord

    store = Store(str(tmp_path / "mlflow"))
    record = RunRecord(key="grid/m/grpo/s0", name="grpo s0", metrics=[("x", 1.0, 1)], start_ms=1_000, end_ms=61_000)
    run_id = store.upsert("e", record)
    info = MlflowClient(store.uri).get_run(run_id).info
    assert (info.start_time, info.end_time) == (1_000, 61_000)
    assert store.upsert("e", record) == run_id  # unchanged: kept
    later = RunRecord(key="grid/m/grpo/s0", name="grpo s0", metrics=[("x", 1.0, 1)], start_ms=5_000, end_ms=9_000)
    new_id = store.upsert("e", later)
    assert new_id != run_id and MlflowClient(store.uri).get_run(new_id).info.start_time == 5_000


def test_a_moved_results_folder_reads_and_writes_its_own_artifacts(results, tmp_path):
    """MLflow records absolute artifact locations: a results folder moved (or copied) elsewhere has them pointed at
    its own store on the next open, so the UI shows its artifacts and new ones never go to the old place."""
    grid, evals, metrics, res = results
    ids = sync(results)
    moved = tmp_path / "elsewhere" / "results"
    moved.parent.mkdir()
    shutil.move(res, moved)
    store = Store(moved / "mlflow")  # relocates
    info = store.client.get_run(ids["tables"]).info
    assert info.artifact_uri.startswith((moved / "mlflow" / "artifacts").resolve().as_uri()), info.artifact_uri
    names = {Path(a.path).name for a in store.client.list_artifacts(ids["tables"], "tables")}
    assert "table2.md" in names
    local = store.client.download_artifacts(ids["tables"], "tables/table2.md", str(tmp_path))
    assert Path(local).read_text() == (moved / "tables" / "table2.md").read_text()
    # a sync at the new place writes there; the old place stays gone
    moved_evals = [str(moved / Path(p).relative_to(res)) for p in evals]
    moved_metrics = [str(moved / Path(p).relative_to(res)) for p in metrics]
    sync_grid_mlflow(grid, moved_evals, moved_metrics, str(moved), str(moved / "mlflow"), "calibrl-test")
    assert not res.exists()
    assert (
        Store(moved / "mlflow")
        .client.get_experiment_by_name("calibrl-test-grid")
        .artifact_location.startswith((moved / "mlflow" / "artifacts").resolve().as_uri())
    )


def test_a_deleted_run_folder_leaves_the_ui_and_the_tables_refuse_to_report_it(results, capsys):
    grid, evals, metrics, res = results
    from calibrl.cli import main

    first = sync(results)
    assert main(["tables", "--results", str(res), "--no-paper"]) == 0
    gone = res / "runs" / "qwen3-tiny-m" / "grpo" / "s1"
    shutil.rmtree(gone)
    assert main(["tables", "--results", str(res), "--no-paper"]) == 2  # the tables still hold the deleted run
    err = capsys.readouterr().err
    assert "result files the tables were made from are gone" in err and str(gone) in err, err
    # the workflow's rerun without that run (its grid cut to the rest): aggregation, then MLflow
    keep = [p for p in evals if str(gone) not in p], [p for p in metrics if str(gone) not in p]
    aggregate_job(grid, *keep, str(res), str(res / "aggregate.json"))
    again = sync_grid_mlflow(grid, *keep, str(res), str(res / "mlflow"), "calibrl-test")
    assert "grid/qwen3-tiny-m/grpo/s1" not in again
    client = MlflowClient(Store(res / "mlflow").uri)
    assert client.get_run(first["grid/qwen3-tiny-m/grpo/s1"]).info.lifecycle_stage == "deleted"
    assert client.get_run(first["grid/qwen3-tiny-m/grpo/s0"]).info.lifecycle_stage == "active"
    assert main(["tables", "--results", str(res), "--no-paper"]) == 0
