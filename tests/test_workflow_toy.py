"""The `toy` target end to end through Snakemake, in a temporary directory, on a small setting."""

import json

import pandas as pd
import pytest
from conftest import load_config, snakemake, write_config
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow  # minutes: `make test-fast` leaves it out, `make test` runs it


def test_toy_target_end_to_end(workflow_dir):
    cfg = load_config(workflow_dir)
    cfg["toy"].update(steps=60, seeds=12, record_every=20)
    small = write_config(workflow_dir / "small.yaml", cfg)
    snakemake(workflow_dir, "--cores", "2", "toy", "--configfile", str(small))

    toy = workflow_dir / "results" / "toy"
    for fig in ("fig1", "fig2", "fig3", "fig4", "fig5"):
        for name in ("seeds.csv.gz", "curves.csv", "stats.csv", "plot.png"):
            assert (toy / fig / name).stat().st_size > 0, (fig, name)
        assert (workflow_dir / "results" / "logs" / "toy" / f"{fig}.log").exists()
    seeds = pd.read_csv(toy / "fig2" / "seeds.csv.gz")
    assert {"seed", "step", "p_cat", "p_persian", "p_siamese_heldout"} <= set(seeds.columns)
    assert seeds["seed"].nunique() == 12 and sorted(seeds["step"].unique()) == [0, 20, 40, 60]
    stats = pd.read_csv(toy / "fig1" / "stats.csv")
    scales = cfg["toy"]["lr_scales"]
    assert len(stats) == 9 * len(scales) and sorted(stats["lr_scale"].unique()) == sorted(scales)
    assert {"t90_median", "collapsed_end", "cat_won", "dominance_auc", "lr"} <= set(stats.columns)
    verdicts = (toy / "verdicts.md").read_text()
    for claim in ("Larger G delays collapse", "IAC retards collapse", "IAC + DLC arrests collapse"):
        assert claim in verdicts
    claims = pd.read_csv(toy / "claims.csv")
    assert len(claims) == 9 and (claims["role"] == "exploratory").all() and (claims["source"] == "toy").all()
    assert set(claims["verdict"]) <= {"holds", "contradicted", "absent", "inconclusive"}
    assert claims["note"].str.startswith("over lr x{" + ", ".join(f"{x:g}" for x in scales) + "}").all()
    assert claims["note"].str.contains(", 60 steps; per lr: ", regex=False).all()
    assert not list(toy.rglob("*.tmp"))

    runs = json.loads((toy / "mlflow_runs.json").read_text())
    client = MlflowClient(tracking_uri=runs["tracking_uri"])
    exp = client.get_experiment_by_name(cfg["mlflow_experiment"])
    first = client.search_runs([exp.experiment_id], max_results=1000)
    n_configs = 9 + 9 + 9 + 9 + 3 * len(cfg["toy"]["fig5_estimators"]) * len(cfg["toy"]["fig5_optimizers"]) * 3
    assert len(first) == n_configs + 1
    one = [r for r in first if r.data.tags.get("figure") == "fig1"][0]
    assert len(client.get_metric_history(one.info.run_id, "p_winner_mean")) == 4
    assert not client.list_artifacts(one.info.run_id)  # each figure's plot once, in the summary run
    summary = [r for r in first if r.info.run_name == "toy verdicts"][0]
    assert {a.path for a in client.list_artifacts(summary.info.run_id, "plots")} == {
        f"plots/{f}" for f in ("fig1", "fig2", "fig3", "fig4", "fig5")
    }
    assert client.list_artifacts(summary.info.run_id, "plots/fig1")[0].path == "plots/fig1/plot.png"

    # Rerunning is idempotent: nothing to do, and a forced MLflow sync duplicates nothing.
    again = snakemake(workflow_dir, "--cores", "2", "toy", "--configfile", str(small), "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    snakemake(workflow_dir, "--cores", "1", "toy", "--configfile", str(small), "--forcerun", "toy_mlflow")
    second = client.search_runs([exp.experiment_id], max_results=1000)
    assert {(r.info.run_name, r.info.run_id) for r in second} == {(r.info.run_name, r.info.run_id) for r in first}
    assert len(client.get_metric_history(one.info.run_id, "p_winner_mean")) == 4
