"""``calibrl trainers``: the same cells of two trainers' results folders side by side, refused where they are not
the same cell (calibrl.report.trainers)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from calibrl.checkpoints import RunStamp
from calibrl.cli import main
from calibrl.report.trainers import compare, render

SAMPLING = {"k": 4, "n": 4, "temperature": 1.0, "seed": 7}
SETTINGS = {"method": {"estimator": "grpo", "iac_alpha": 1.0}, "seed": 0, "train": {"lr": 1e-6}}


def _folder(root, trainer, correct, *, settings=None, sampling=None, metrics=None, runs=("m/grpo/s0",)):
    for run in runs:
        folder = root / "runs" / run
        (folder / "eval").mkdir(parents=True)
        stamp = RunStamp.build({**(settings or SETTINGS), "run": run, "backend": trainer}, {"model": "abc"})
        stamp.write(folder / "settings.json")
        split = {"avg_at_4": float(np.mean(correct)) / 4, "pass_at_4": 0.0, "n_samples": 4, "n_problems": len(correct),
                 "per_problem": {"correct": correct, "distinct": [1] * len(correct)}}  # fmt: skip
        (folder / "eval" / "step_2.json").write_text(
            json.dumps({"step": 2, "sampling": sampling or SAMPLING, "splits": {"test": split}})
        )
        rows = metrics or [{"step": 1, "entropy": 0.5, "only_here": 1.0}]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_the_difference_and_its_interval_are_paired_over_problems(tmp_path):
    a = _folder(tmp_path / "a", "openrlhf", [0, 1, 2, 4, 3, 0])
    b = _folder(tmp_path / "b", "verl", [1, 1, 4, 4, 2, 2],
                metrics=[{"step": 1, "entropy": 0.25, "actor/pg_loss": 0.1}])  # fmt: skip
    trainers, evals, train = compare(a, b)
    assert trainers == ("openrlhf", "verl")
    avg = evals[evals.metric == "AVG@4"].iloc[0]
    d = (np.array([1, 1, 4, 4, 2, 2]) - np.array([0, 1, 2, 4, 3, 0])) / 4
    half = stats.t.ppf(0.975, 5) * d.std(ddof=1) / np.sqrt(6)
    assert (avg.a, avg.b, avg.problems) == pytest.approx((10 / 24, 14 / 24, 6))
    assert (avg["diff"], avg.low, avg.high) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
    pas = evals[evals.metric == "PASS@4"].iloc[0]  # n = k = 4: pass@4 is 1 where any sample is correct
    assert (pas.a, pas.b) == pytest.approx((4 / 6, 1.0))
    # only what both log under one name
    assert train[["step", "metric", "a", "b"]].values.tolist() == [[1, "entropy", 0.5, 0.25]]
    text = render(trainers, evals, train)
    assert "| m/grpo/s0 | 2 | test | AVG@4 | 0.417 | 0.583 | +0.167 |" in text


def test_the_command_writes_the_table_and_refuses_what_is_not_one_cell(tmp_path, capsys):
    a = _folder(tmp_path / "a", "openrlhf", [0, 4], runs=("m/grpo/s0", "m/rloo/s0"))
    b = _folder(tmp_path / "b", "verl", [4, 4])
    assert main(["trainers", str(a), str(b), "--out", str(tmp_path / "t.md"), "--csv", str(tmp_path / "t.csv")]) == 0
    assert "# The same cells under openrlhf and verl" in capsys.readouterr().out
    assert (tmp_path / "t.md").is_file() and "AVG@4" in (tmp_path / "t.csv").read_text()
    # one trainer twice
    assert main(["trainers", str(a), str(a)]) == 2
    assert "both trained by openrlhf" in capsys.readouterr().err
    # a setting beyond the trainer
    c = _folder(tmp_path / "c", "verl", [4, 4], settings={**SETTINGS, "train": {"lr": 2e-6}})
    with pytest.raises(ValueError, match=r"m/grpo/s0: not the same cell .*settings\.train\.lr"):
        compare(a, c)
    # evaluated with other sampling
    d = _folder(tmp_path / "d", "verl", [4, 4], sampling={**SAMPLING, "temperature": 0.6})
    with pytest.raises(ValueError, match=r"step_2.json: evaluated differently, sampling.\['temperature'\]"):
        compare(a, d)
    # no run in both
    e = _folder(tmp_path / "e", "verl", [4, 4], runs=("m/dapo/s1",))
    with pytest.raises(ValueError, match="no run in both"):
        compare(a, e)
