"""MLflow while the grid runs (calibrl.live) on a real SQLite store: a run shows up while it trains, running, with
the evaluations and training steps so far; later rounds and the final sync (rule grid_mlflow) extend the same run; a
round that comes after a fuller log changes nothing; a retrained run replaces the old one."""

import json
import shutil

import pytest
from conftest import fake_run_results, filled
from mlflow.tracking import MlflowClient

from calibrl import grid as G
from calibrl.checkpoints import settings_job
from calibrl.live import log_round
from calibrl.report.jobs import aggregate_job
from calibrl.report.mlflow_view import experiments, sync_grid_mlflow
from calibrl.tracking import Store

RUNS = [("qwen3-tiny-m", "grpo", 0), ("qwen3-tiny-m", "iac", 0)]
KEY = "grid/qwen3-tiny-m/grpo/s0"


@pytest.fixture
def grid_results(tmp_path):
    """A finished results folder (fake numbers), a live spec as the Snakefile writes it, and the files of run
    grpo/s0 moved aside: its step-50 evaluation and its final training metrics (the run still trains)."""
    config = filled("config")
    grid = config["grid"]
    grid["models"] = {"qwen3-tiny-m": grid["models"]["qwen3-tiny-m"]}
    grid["seed"] = 0
    grid["tables"] = {"table2_3": ["grpo", "iac"], "table4": ["iac"], "table5": ["grpo", "iac"], "figure6": []}
    # the live spec's grid holds the compiled methods, as the Snakefile writes it; the config keeps the switches
    live_grid = {**grid, "methods": {m: G.method(config, m).to_dict() for m in ("grpo", "iac")}}
    res = tmp_path / "results"
    evals, metrics = fake_run_results(res, RUNS, k=8, splits=("test",))
    run = res / "runs" / "qwen3-tiny-m" / "grpo" / "s0"
    (tmp_path / "train.jsonl").write_text('{"prompt": "x"}\n')
    params = G.train_params(config, G.Run("qwen3-tiny-m", "grpo", 0))
    settings_job(params, None, str(run / "settings.json"), {"train": str(tmp_path / "train.jsonl")})
    # the local trainer's log of the steps so far (calibrl.backends.local: ckpt/metrics.jsonl)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "ckpt").mkdir()
    (run / "ckpt" / "metrics.jsonl").write_text("".join(lines[:25]))
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in ("eval/step_50.json", "metrics.jsonl"):
        shutil.move(run / name, aside / name.replace("/", "_"))
    spec = {
        "root": str(res),
        "store": str(res / "mlflow"),
        "experiment": "calibrl-live",
        "architectures": {"qwen3-tiny-m": {"hidden_size": 16}},
        "grid": live_grid,
        "runs": [
            {
                "run": f"{m}/{method}/s{s}",
                "evals": [str(res / "runs" / m / method / f"s{s}" / "eval" / f"step_{k}.json") for k in (25, 50)],
                "base": "",
            }
            for m, method, s in RUNS
        ],  # fmt: skip
    }
    return spec, res, run, aside, evals, metrics


def points(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def grid_run(store, key=KEY):
    exp = store.client.get_experiment_by_name(experiments("calibrl-live")["grid"])
    runs = store.client.search_runs([exp.experiment_id], filter_string=f"tags.`calibrl.key` = '{key}'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def test_a_run_is_logged_as_it_trains_then_extended_to_the_final_view(grid_results):
    spec, res, run, aside, evals, metrics = grid_results
    seen = {}
    assert log_round(spec, seen) == 2
    store = Store(spec["store"])
    live = grid_run(store)
    assert live.info.status == "RUNNING"
    assert [s for s, _ in points(store.client, live.info.run_id, "eval/test/avg_at_8")] == [25]
    assert [s for s, _ in points(store.client, live.info.run_id, "train/reward")] == list(range(1, 26))
    assert grid_run(store, "grid/qwen3-tiny-m/iac/s0").info.status == "FINISHED"
    assert log_round(spec, seen) == 0  # nothing changed: nothing logged

    # the run's next checkpoint and its end: the same run, extended, finished
    shutil.move(aside / "eval_step_50.json", run / "eval" / "step_50.json")
    shutil.move(aside / "metrics.jsonl", run / "metrics.jsonl")
    assert log_round(spec, seen) == 1
    done = grid_run(store)
    assert done.info.run_id == live.info.run_id and done.info.status == "FINISHED"
    assert [s for s, _ in points(store.client, done.info.run_id, "eval/test/avg_at_8")] == [25, 50]
    assert [s for s, _ in points(store.client, done.info.run_id, "train/reward")] == list(range(1, 51))

    # the final sync (rule grid_mlflow) keeps the live runs: the same ids, no point twice
    aggregate_job(spec["grid"], evals, metrics, str(res), str(res / "aggregate.json"))
    ids = sync_grid_mlflow(spec["grid"], evals, metrics, str(res), spec["store"], "calibrl-live",
                           architectures=spec["architectures"])  # fmt: skip
    assert ids[KEY] == live.info.run_id
    assert len(points(store.client, live.info.run_id, "train/reward")) == 50

    # a late round built from fewer files (the step-50 evaluation gone from its view) never replaces the fuller run
    seen.clear()
    shutil.move(run / "eval" / "step_50.json", aside / "late.json")
    assert log_round(spec, seen) == 2
    assert grid_run(store).info.run_id == live.info.run_id
    assert [s for s, _ in points(store.client, live.info.run_id, "eval/test/avg_at_8")] == [25, 50]

    # a retrained run (other numbers at step 25) replaces it: one run per key, the old one deleted
    path = run / "eval" / "step_25.json"
    data = json.loads(path.read_text())
    data["splits"]["test"]["avg_at_8"] = 0.9
    path.write_text(json.dumps(data))
    assert log_round(spec, seen) == 1
    new = grid_run(store)
    assert new.info.run_id != live.info.run_id and new.info.status == "RUNNING"
    assert MlflowClient(store.uri).get_run(live.info.run_id).info.lifecycle_stage == "deleted"
