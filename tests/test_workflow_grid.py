"""The micro grid (.test/config.yaml) end to end through Snakemake: data, warm start, every method of
Tables 2-5 and Figure 6 (one model plus a DLC memory), checkpoint evaluation, tables and MLflow; then what a
rerun after a config change redoes (issue 14): exactly the jobs that read the changed setting."""

import hashlib
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import copy_workflow, snakemake
from mlflow.tracking import MlflowClient

from calibrl import analysis_plan as AP
from calibrl import grid as G

MICRO = ".test/config.yaml"
pytestmark = pytest.mark.slow  # minutes: `make test-fast` leaves it out, `make test` runs it


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished micro grid, as a user runs it: ``snakemake --cores 2 --configfile .test/config.yaml``."""
    work = copy_workflow(tmp_path_factory.mktemp("grid"))
    plan = snakemake(work, "-n", "--configfile", MICRO)
    snakemake(work, "--cores", "2", "--configfile", MICRO)
    return work, plan


def planned(work, *configs: str) -> dict[str, int]:
    """Jobs per rule that ``snakemake -n`` plans with these config files (from its job stats table)."""
    out = snakemake(work, "-n", "--configfile", MICRO, *configs)
    text = out.stdout + out.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def overlay(work, name: str, grid: dict) -> str:
    (work / name).write_text(yaml.safe_dump({"grid": grid}))
    return name


def test_micro_grid_end_to_end(finished):
    workflow_dir, plan = finished
    cfg = yaml.safe_load((workflow_dir / MICRO).read_text())
    runs = {"grpo", "iac", "dapo", "dapo_iac_dlc", "filter"}
    res = workflow_dir / cfg["results"]
    for method in runs:
        for step in (2, 4):
            ev = json.loads((res / "runs" / "qwen3-tiny-m" / method / "s0" / "eval" / f"step_{step}.json").read_text())
            assert set(ev["splits"]) == {"train", "test", "ood"}  # train: RL's own problems
            assert 0 <= ev["splits"]["test"]["avg_at_4"] <= ev["splits"]["test"]["pass_at_4"] <= 1
    drawn = AP.load(workflow_dir / ".test" / "plan.yaml").seeds  # the plan's seeds, drawn from its SHA-256
    assert all((res / "runs" / "qwen3-tiny-m" / m / f"s{s}" / "eval" / "step_4.json").exists()
               for m in ("grpo", "iac") for s in drawn)  # fmt: skip
    for seed in (0, *drawn):  # the base model at step 0, with each seed's sampling stream
        base = json.loads((res / "runs" / "qwen3-tiny-m" / "base" / f"s{seed}" / "eval" / "step_0.json").read_text())
        assert base["step"] == 0 and base["seed"] == seed and set(base["splits"]) == {"train", "test", "ood"}
    assert (res / "runs" / "qwen3-tiny-m" / "filter" / "s0" / "filter.json").exists()
    for table in ("table2", "table3", "table4", "table5"):
        assert (res / "tables" / f"{table}.md").read_text().startswith("### Table")
    t5 = pd.read_csv(res / "tables" / "table5.csv")
    assert {"grpo", "iac", "filter"} <= set(t5.columns)
    assert (res / "figures" / "figure6_entropy.png").stat().st_size > 0
    summary = (res / "summary.md").read_text()
    assert "IAC above grpo" in summary and "Seed noise" in summary
    # the plan's primary claims, then every claim of Tables 2-5, Figure 6 and the toy, each with its verdict
    claims = pd.read_csv(res / "claims.csv")
    assert {"claim", "role", "estimate", "ci_low", "ci_high", "seeds", "verdict", "plan_sha256"} <= set(claims.columns)
    assert set(claims["verdict"]) <= {"holds", "contradicted", "negligible", "absent", "inconclusive"}
    assert set(claims["source"]) >= {".test/plan.yaml", "table2/3/5 (alpha 1 vs 0)", "table4", "table5", "toy"}
    assert (
        claims["plan_sha256"] == hashlib.sha256((workflow_dir / ".test" / "plan.yaml").read_bytes()).hexdigest()
    ).all()
    primary = claims[claims["role"] == "primary"]
    assert list(primary["claim"].str[:3]) == ["P1:", "P2:", "P3:"] and (primary["seeds"] == 2).all()
    assert (primary["df"] == 1).all()  # two data seeds
    over = primary.iloc[2]  # Definition 2.1 from the modes measured at step 0 and step 4, on the training problems
    assert over["quantity"].startswith("oversharpened (points)") and "splits weighed train 1" in over["quantity"]
    assert np.isfinite(over["estimate"]) and over["estimate"] >= 0  # the base model against itself is 0
    regime = claims[claims["source"] == "regime"]
    assert len(regime) == 2 and regime["quantity"].str.endswith("on train; t over 3 data seeds").all()
    assert "### What each verdict can and cannot support" not in summary  # the micro plan writes no scope notes
    dlc = claims[claims["claim"] == "DLC adds to DAPO+IAC (AVG@4)"]
    assert dlc.empty or dlc.iloc[0]["verdict"] == "inconclusive"  # one paired seed: never decided
    header = "| claim | role | estimate | 95% CI | 90% CI, margin | p min. effect | seeds | p (Holm within a family) |"
    assert header in summary
    assert set(primary["reading"]) <= {*claims["verdict"], "holds (below the margin)", "holds (at least the margin)",
                                       "holds (size unresolved)", "negligible (in the claimed direction)",
                                       "negligible (against the claim)"}  # fmt: skip
    assert "## Each arm against the base model" in summary and (res / "tables" / "base_changes.csv").exists()
    assert (res / "figures" / "primary_claims.png").stat().st_size > 0
    for what in ("pass_at_k", "distinct_correct", "entropy_bands"):
        assert (res / "figures" / f"{what}_qwen3-tiny-m.png").stat().st_size > 0
    for log in ("warmstart/qwen3-tiny-m/d0.log", "train/qwen3-tiny-m/dapo_iac_dlc/s0/segment_2.log", "aggregate.log"):
        assert (res / "logs" / log).stat().st_size > 0
    # MLflow while the grid ran (calibrl.live): runs logged as their files appeared, before rule grid_mlflow, and the
    # final view kept those runs (the same ids), extended
    live_log = (res / "logs" / "mlflow_live.log").read_text()
    live = re.findall(r"logged (grid/\S+) as MLflow run (\w+)", live_log)
    assert live and "ERROR" not in live_log, live_log[-3000:]
    final = json.loads((res / "grid_mlflow.json").read_text())["runs"]
    last = dict(live)  # a run's latest live id
    assert len(last) >= 3 and all(final[key] == run_id for key, run_id in last.items()), (live, final)

    client = MlflowClient(tracking_uri=f"sqlite:///{(res / 'mlflow' / 'mlflow.db').resolve()}")
    exp = client.get_experiment_by_name(cfg["mlflow_experiment"] + "-grid")
    grid_runs = client.search_runs([exp.experiment_id], max_results=500)
    assert len(grid_runs) == len(runs) + 2 * len(drawn) + 1 + len(drawn)  # seed 0, the plan's seeds, base per seed
    report = client.get_experiment_by_name(cfg["mlflow_experiment"] + "-claims")
    claim_runs = client.search_runs([report.experiment_id], filter_string="tags.part = 'claims'", max_results=500)
    assert len(claim_runs) == len(claims)
    dlc = [r for r in grid_runs if r.data.tags.get("method") == "dapo_iac_dlc"][0]
    assert dlc.data.params["dlc_mu"] == "0.5" and dlc.data.tags["mu"] == "0.5"
    # the evaluation curve starts at the base model (step 0, the same seed's evaluation), then each checkpoint
    assert sorted(m.step for m in client.get_metric_history(dlc.info.run_id, "eval/test/avg_at_4")) == [0, 2, 4]
    assert len(client.get_metric_history(dlc.info.run_id, "train/reward")) == 4  # every step samples
    lines = (res / "runs" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0" / "metrics.jsonl").read_text().splitlines()
    trained = sum("entropy" in json.loads(line) for line in lines)  # of the trained groups: DAPO may train none
    assert len(client.get_metric_history(dlc.info.run_id, "train/entropy")) == trained

    assert json.loads((res / "grid_mlflow.json").read_text())["runs"]["tables"]
    beside = (res / "tables" / "table4_vs_paper.md").read_text()
    assert "only orderings and signs" in beside and "| PASS@8 | dapo_iac_dlc | **95.19**" in beside
    assert "The paper's orderings in our numbers" in beside and "Beside the paper" in summary

    assert "train" in plan.stdout

    # The self-contained report of the finished run: every table, figure and verdict, by paper section.
    snakemake(workflow_dir, "--report", f"{cfg['results']}/report.html", "--configfile", MICRO)
    html = (res / "report.html").read_text()
    for name in (
        "table2_vs_paper.html",
        "table5_vs_paper.html",
        "figure6_entropy.png",
        "avg_at_4_qwen3-tiny-m.png",
        "summary.html",
        "verdicts.html",
        "claims.csv",
        "pass_at_k_qwen3-tiny-m.png",
        "4.2 Main results",
        "Appendix I, Table 5",
        "2.4 Softmax toy",
    ):
        assert name in html, name

    # The terminal view of the same tables.
    cli = subprocess.run(
        [sys.executable, "-m", "calibrl.cli", "tables", "--results", str(res), "--table", "table2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Table 2: AVG@4 (%), beside the paper" in cli.stdout and "| qwen3-tiny-m | grpo |" in cli.stdout
    assert "<u>" not in cli.stdout and "<u>" in (res / "tables" / "table2_vs_paper.md").read_text()  # no raw HTML


# ------------------------------------------------------------------------- reruns after a config change
def test_figures_plot_the_seed_level_results(finished):
    """What each accuracy figure plots (figures/<metric>_<model>.csv, written with the PNG) is, per split, method and
    evaluated step, the mean over seeds of the evaluation files' own numbers with their t interval; the primary
    claims' panels carry claims.csv's verdicts; Figure 6 is over every seed of its methods."""
    import numpy as np
    from scipy import stats as st

    work = finished[0]
    cfg = yaml.safe_load((work / MICRO).read_text())
    res = work / cfg["results"]
    k = cfg["grid"]["eval"]["k"]
    plotted = pd.read_csv(res / "figures" / f"avg_at_{k}_qwen3-tiny-m.csv")
    values = {}  # (split, method, step) -> per-seed AVG@k from the evaluation files
    for path in (res / "runs" / "qwen3-tiny-m").glob("*/s*/eval/step_*.json"):
        data = json.loads(path.read_text())
        for split, m in data["splits"].items():
            key = (split, path.parts[-4], int(data["step"]))
            values.setdefault(key, []).append(m[f"avg_at_{k}"])
    assert len(plotted) == len(values) and set(plotted["method"]) >= {"base", "grpo", "iac", "dapo_iac_dlc"}
    for row in plotted.itertuples():
        seeds = np.array(values[(row.panel.split(": ")[1].split(",")[0], row.method, int(row.x))]) * 100
        assert row.seeds == len(seeds) and row.y == pytest.approx(seeds.mean(), rel=1e-5), row  # CSV: 6 digits
        if len(seeds) > 1:  # no spread over seeds: a zero-width interval (scipy says NaN)
            low, high = (
                st.t.interval(0.95, len(seeds) - 1, seeds.mean(), st.sem(seeds)) if seeds.std() else [seeds[0]] * 2
            )
            assert (row.low, row.high) == pytest.approx((low, high), rel=1e-5, abs=1e-9), row
    claims = pd.read_csv(res / "claims.csv").set_index("claim")["verdict"]
    primary = pd.read_csv(res / "figures" / "primary_claims.csv")
    drawn = AP.load(work / ".test" / "plan.yaml").seeds  # the panels draw the seeds the claims read, not seed 0 too
    assert set(primary["seeds"]) == {len(drawn)}, primary[["panel", "method", "x", "seeds"]]
    panels = primary["panel"].unique()
    assert len(panels) == (claims.index.str.match(r"P\d+:")).sum()
    for panel in panels:
        claim, _, verdict = panel.rpartition(": ")
        assert claims[claim] == verdict, panel
    fig6 = pd.read_csv(res / "tables" / "figure6_entropy.csv")
    seeds_of = {m: len(list((res / "runs" / "qwen3-tiny-m" / m).glob("s*"))) for m in cfg["grid"]["tables"]["figure6"]}
    assert fig6.groupby("method")["seeds"].max().to_dict() == seeds_of
    drawn = pd.read_csv(res / "figures" / "figure6_entropy.csv").set_index(["method", "x"])["y"]
    table = fig6.set_index(["method", "step"])["entropy_smoothed"]
    assert drawn.to_numpy() == pytest.approx(table.loc[drawn.index].to_numpy(), nan_ok=True)  # one frame, both


def test_unchanged_rerun_plans_nothing(finished):
    assert planned(finished[0]) == {}


def test_a_code_update_replans_nothing_finished(finished):
    """A `git pull` that edits the thin scripts (and touches every file): no finished job is replanned
    (profiles/default: rerun on params, inputs and input times, not on code)."""
    work = finished[0]
    scripts = {p: p.read_text() for p in (work / "scripts").glob("*.py")}
    try:
        for path, text in scripts.items():
            path.write_text(text + "# a comment from upstream\n")
        assert planned(work) == {}
    finally:
        for path, text in scripts.items():
            path.write_text(text)


@pytest.mark.parametrize(
    "change, expected",
    [
        # a training setting: every run's settings, training (a job per checkpoint), metrics and evaluations
        # (9 runs: GRPO and IAC on seed 0 and the plan's 2 drawn seeds, DAPO, DAPO+IAC+DLC and filtering on seed 0)
        ({"train": {"lr": 0.001}}, {"run_settings": 9, "train": 18, "train_metrics": 9, "evaluate": 18}),
        # one method's alpha: that method's runs only (iac, 3 seeds, is in three tables, trained once)
        (
            {"methods": {"iac": {"estimator": "grpo", "iac_alpha": 1.5}}},
            {"run_settings": 3, "train": 6, "train_metrics": 3, "evaluate": 6},
        ),
        # a longer run (CPU trainer): the new segment resumes, only the new checkpoint is evaluated
        ({"train": {"steps": 6}}, {"train": 9, "train_metrics": 9, "evaluate": 9}),
        # how checkpoints are evaluated: every evaluation (the base model's per seed too), no training
        ({"eval": {"temperature": 0.7}}, {"evaluate": 18, "evaluate_base": 3}),
        # a table's method list (same runs): the aggregation only
        ({"tables": {"table5": ["iac", "grpo", "filter"]}}, {}),
        # how many grading workers: how fast, never what; nothing reruns
        ({"workers": 2}, None),
    ],
    ids=["train.lr", "one-alpha", "train.steps", "eval.temperature", "table-list", "workers"],
)
def test_a_changed_setting_plans_exactly_what_reads_it(finished, change, expected):
    work = finished[0]
    jobs = planned(work, overlay(work, "change.yaml", change))
    if expected is None:
        assert jobs == {}
    else:
        assert jobs == {**expected, "aggregate": 1, "grid_mlflow": 1, "all": 1}


def grpo_s0(work):
    """The micro grid's config, results folder, and its GRPO seed-0 run with that run's folder."""
    cfg = yaml.safe_load((work / MICRO).read_text())
    res = work / cfg["results"]
    run = G.Run("qwen3-tiny-m", "grpo", 0)
    return cfg, res, run, res / "runs" / run.path


def test_an_evaluation_setting_re_evaluates_without_training(finished):
    """A changed evaluation setting reruns every checkpoint's evaluation and nothing of training: the training
    logs, checkpoints and metrics stay as they are, and every evaluation carries the new setting."""
    work, _ = finished
    cfg, res, run, folder = grpo_s0(work)
    stamp = json.loads((folder / "settings.json").read_text())["fingerprint"]
    metrics = (folder / "metrics.jsonl").read_text()
    train_logs = sorted((p.name, p.stat().st_mtime_ns) for p in (res / "logs" / "train").rglob("*.log"))
    weights = sorted((p.name, p.stat().st_mtime_ns) for p in (folder / "ckpt").rglob("*.safetensors"))
    temperature = overlay(work, "temperature.yaml", {"eval": {"temperature": 0.7}})
    snakemake(work, "--cores", "2", "--configfile", MICRO, temperature)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (res / "logs" / "train").rglob("*.log")) == train_logs
    assert (folder / "metrics.jsonl").read_text() == metrics
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (folder / "ckpt").rglob("*.safetensors")) == weights
    for step in G.eval_steps(cfg):
        result = json.loads((folder / "eval" / f"step_{step}.json").read_text())
        assert result["sampling"]["temperature"] == 0.7 and result["fingerprint"] == stamp
    assert planned(work, temperature) == {}


def test_a_changed_training_setting_retrains_and_reports_the_new_numbers(finished):
    """The real rerun (last in this module: it changes the finished run): every run trains from scratch with
    the new learning rate, never resuming the old checkpoints, its evaluations and tables are redone, the
    warm starts are not, and a second run plans nothing."""
    work, _ = finished
    cfg, res, run, folder = grpo_s0(work)
    old_stamp = json.loads((folder / "settings.json").read_text())["fingerprint"]
    old_metrics = (folder / "metrics.jsonl").read_text()
    old_eval = json.loads((folder / "eval" / "step_4.json").read_text())
    warm = (res / "models" / "qwen3-tiny-m" / "d0" / "init.json").stat().st_mtime_ns  # seed 0's data seed
    assert old_eval["fingerprint"] == old_stamp

    lr = overlay(work, "lr.yaml", {"train": {"lr": 0.003}})
    snakemake(work, "--cores", "2", "--configfile", MICRO, lr)
    new_stamp = json.loads((folder / "settings.json").read_text())["fingerprint"]
    assert new_stamp != old_stamp
    log = (res / "logs" / "train" / run.path / f"segment_{min(G.eval_steps(cfg))}.log").read_text()
    assert "settings changed: train.lr" in log and "resumed from checkpoint" not in log, log[-3000:]
    assert (folder / "stale" / old_stamp / "ckpt" / "step_4" / "trainer_state.pt").exists()  # the old work, aside
    assert (folder / "metrics.jsonl").read_text() != old_metrics
    new_eval = json.loads((folder / "eval" / "step_4.json").read_text())
    assert new_eval["fingerprint"] == new_stamp and new_eval["splits"] != old_eval["splits"]
    for marker in (folder / "ckpt").glob("step_*.done"):
        assert json.loads(marker.read_text())["fingerprint"] == new_stamp
    assert (res / "models" / "qwen3-tiny-m" / "d0" / "init.json").stat().st_mtime_ns == warm
    # what a user reads shows the new numbers: the tables and claims are redone from the new evaluations, and
    # the run's MLflow view holds the new evaluation and the new learning rate
    for table in (res / "tables" / "table2.csv", res / "claims.csv"):
        assert table.stat().st_mtime > (folder / "eval" / "step_4.json").stat().st_mtime, table
    client = MlflowClient(tracking_uri=f"sqlite:///{res / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(f"{cfg['mlflow_experiment']}-grid")
    [mlrun] = client.search_runs([exp.experiment_id], "tags.method = 'grpo' and tags.seed = '0'")
    k = cfg["grid"]["eval"]["k"]
    history = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, f"eval/test/avg_at_{k}")}
    assert history[4] == pytest.approx(new_eval["splits"]["test"][f"avg_at_{k}"])
    assert float(mlrun.data.params["grid.train.lr"]) == 0.003
    assert planned(work, lr) == {}
