"""A micro version of the embedded grid end to end through Snakemake: data, warm start, every method of
Tables 2-5 and Figure 6 (one model plus a DLC memory), checkpoint evaluation, tables and MLflow."""

import json
import subprocess
import sys

import pandas as pd
from conftest import load_config, snakemake, write_config
from mlflow.tracking import MlflowClient


def micro_config(workdir):
    cfg = load_config(workdir)
    cfg["toy"].update(steps=20, seeds=4, record_every=10)
    grid = cfg["grid"]
    grid["data"]["splits"] = {"train": 48, "test": 8, "ood": 4}
    grid["models"] = {
        "qwen3-tiny-m": {**grid["models"]["qwen3-tiny-m"], "hidden_size": 32, "num_layers": 1, "intermediate_size": 64}
    }
    grid["warmstart"].update(steps=20, batch_size=16)
    grid["train"].update(steps=4, eval_every=2, prompts_per_step=4, group_size=4, filter_samples=2)
    grid["eval"]["n"] = grid["eval"]["k"] = 4
    grid["extra_seeds"] = {"grpo": [1]}
    # One run of each kind (`make run` does the full grid): baselines, IAC, the filtering baseline, DAPO,
    # DAPO+IAC+DLC with its memory model, and a second seed.
    grid["tables"] = {
        "table2_3": ["grpo", "iac"],
        "table4": ["dapo", "iac", "dapo_iac_dlc"],
        "table5": ["grpo", "iac", "filter"],
        "figure6": ["dapo", "dapo_iac_dlc"],
    }
    return cfg


def test_micro_grid_end_to_end(workflow_dir):
    cfg = micro_config(workflow_dir)
    # The micro config replaces the default (a --configfile would merge into it and keep its second model).
    write_config(workflow_dir / "config" / "config.yaml", cfg)
    plan = snakemake(workflow_dir, "-n")
    runs = {"grpo", "iac", "dapo", "dapo_iac_dlc", "filter"}
    snakemake(workflow_dir, "--cores", "2")
    res = workflow_dir / "results"
    for method in runs:
        for step in (2, 4):
            ev = json.loads((res / "runs" / "qwen3-tiny-m" / method / "s0" / "eval" / f"step_{step}.json").read_text())
            assert set(ev["splits"]) == {"test", "ood"}
            assert 0 <= ev["splits"]["test"]["avg_at_4"] <= ev["splits"]["test"]["pass_at_4"] <= 1
    assert (res / "runs" / "qwen3-tiny-m" / "grpo" / "s1" / "eval" / "step_4.json").exists()
    assert (res / "runs" / "qwen3-tiny-m" / "filter" / "s0" / "filter.json").exists()
    for table in ("table2", "table3", "table4", "table5"):
        assert (res / "tables" / f"{table}.md").read_text().startswith("### Table")
    t5 = pd.read_csv(res / "tables" / "table5.csv")
    assert {"grpo", "iac", "filter"} <= set(t5.columns)
    assert (res / "figures" / "figure6_entropy.png").stat().st_size > 0
    summary = (res / "summary.md").read_text()
    assert "IAC above grpo" in summary and "Seed noise" in summary
    for log in ("warmstart/qwen3-tiny-m.log", "train/qwen3-tiny-m/dapo_iac_dlc/s0.log", "aggregate.log"):
        assert (res / "logs" / log).stat().st_size > 0

    client = MlflowClient(tracking_uri=f"sqlite:///{(res / 'mlflow' / 'mlflow.db').resolve()}")
    exp = client.get_experiment_by_name(cfg["mlflow_experiment"])
    grid_runs = client.search_runs([exp.experiment_id], filter_string="tags.part = 'grid'", max_results=500)
    assert len(grid_runs) == len(runs) + 1 + 1  # every run, the extra seed, and the tables run
    dlc = [r for r in grid_runs if r.data.tags.get("method") == "dapo_iac_dlc"][0]
    assert dlc.data.params["dlc_mu"] == "0.5" and dlc.data.tags["mu"] == "0.5"
    assert len(client.get_metric_history(dlc.info.run_id, "eval/test/avg_at_4")) == 2
    assert len(client.get_metric_history(dlc.info.run_id, "train/entropy")) == 4

    assert json.loads((res / "grid_mlflow.json").read_text())["runs"]["tables"]
    beside = (res / "tables" / "table4_vs_paper.md").read_text()
    assert "only orderings and signs" in beside and "| PASS@8 | dapo_iac_dlc | **95.19**" in beside
    assert "The paper's orderings in our numbers" in beside and "Beside the paper" in summary

    again = snakemake(workflow_dir, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    assert "train" in plan.stdout

    # The self-contained report of the finished run: every table, figure and verdict, by paper section.
    snakemake(workflow_dir, "--report", "results/report.html")
    html = (res / "report.html").read_text()
    for name in (
        "table2_vs_paper.html",
        "table5_vs_paper.html",
        "figure6_entropy.png",
        "avg_at_4_qwen3-tiny-m.png",
        "summary.html",
        "verdicts.html",
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
