"""Paper-scale training metrics: TensorBoard event files written by OpenRLHF 0.11.2's own TensorboardLogger,
with the names its actor and trainer log, become metrics.jsonl and flow into the tables, Figure 6 and the
claims (the aggregation once crashed on OpenRLHF's ``entropy_loss``, where the tables read ``entropy``)."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import REPO, fake_run_results, load_config

from calibrl.backends.openrlhf.metrics import tensorboard_metrics
from calibrl.report.jobs import aggregate_job

pytest.importorskip("tensorboard")
logging_utils = pytest.importorskip("openrlhf.utils.logging_utils")

RUNS = [("qwen3-tiny-m", "dapo", 0), ("qwen3-tiny-m", "dapo_iac", 0)]


def openrlhf_events(log_dir, entropy: float, steps: int = 6) -> None:
    """One run's event files as OpenRLHF writes them: the step status of ppo_trainer/ppo_actor, and an eval."""
    args = SimpleNamespace(logger=SimpleNamespace(tensorboard_dir=str(log_dir), wandb=SimpleNamespace(run_name="r")))
    logger = logging_utils.TensorboardLogger(args)
    for step in range(1, steps + 1):
        status = {
            "policy_loss": 0.1,
            "reward": 0.5,
            "entropy_loss": entropy - 0.01 * step,  # --actor.entropy_coef 0: the logged token-mean entropy
            "kl": 0.001,
            "response_length": 100.0,
            "timing/generation": 1.5,
            "dynamic_filtering_pass_rate": 0.8,
            "generated_samples": ["a sample", 1.0],
        }
        logger.log_train(step, status)
    logger.log_eval(steps, {"entropy_loss": 99.0, "reward": 99.0})  # evaluation scalars are not training's
    logger.close()


def test_openrlhf_event_files_flow_to_figure6_and_the_claims(tmp_path):
    grid = load_config(REPO)["grid"]
    grid["models"] = {"qwen3-tiny-m": grid["models"]["qwen3-tiny-m"]}
    grid["seed"] = 0  # the fake runs' main seed
    grid["tables"] = {"table2_3": ["dapo"], "table4": ["dapo", "dapo_iac"], "table5": ["dapo"]}
    grid["tables"]["figure6"] = ["dapo", "dapo_iac"]
    res = tmp_path / "results"
    evals, metrics = fake_run_results(res, RUNS, k=8, splits=("test", "ood"))
    for (_, method, _), path in zip(RUNS, metrics, strict=True):
        openrlhf_events(tmp_path / "tb" / method, entropy=0.3 if method == "dapo" else 0.5)
        tensorboard_metrics(str(tmp_path / "tb" / method), path)

    rows = [json.loads(line) for line in open(metrics[0])]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[0]["entropy"] == pytest.approx(0.29) and rows[0]["reward"] == 0.5  # not the eval's 99
    assert rows[0]["timing/generation"] == 1.5 and "entropy_loss" not in rows[0]

    aggregate_job(grid, evals, metrics, str(res), str(res / "aggregate.json"))
    fig6 = pd.read_csv(res / "tables" / "figure6_entropy.csv")
    means = fig6.groupby("method")["entropy"].mean()
    assert means["dapo_iac"] > means["dapo"] and fig6["entropy"].notna().all()
    assert (res / "figures" / "figure6_entropy.png").stat().st_size > 0
    claims = pd.read_csv(res / "claims.csv")
    entropy = claims[claims["claim"].str.contains("entropy", case=False)]
    assert len(entropy) == 1 and entropy["estimate"].iloc[0] == pytest.approx(0.2, abs=1e-6)
