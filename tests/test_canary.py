"""The preflight's training canary (``calibrl.preflight.canaries``, ``calibrl.gpu.canary``, each GPU backend's
check): which runs it trains on each request shape of the paper's grid, with what, and how a failure is named. The
canary itself trains in the CPU rehearsals' preflights (tests/test_rehearsal.py, where an injected fault makes it
fail; tests/test_rehearsal_verl.py)."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO, filled

from calibrl import backends
from calibrl import grid as G
from calibrl import preflight as PF
from calibrl.backends import CheckFailed
from calibrl.gpu import canary

PAPER = filled("paper")


def test_each_kind_of_training_run_of_a_shape_gets_one_canary_with_the_runs_own_settings():
    one = PF.params(PAPER, "n1-gpu8")["canary"]
    assert [(c["kind"], c["run"]) for c in one] == [
        ("plain", "qwen3-4b/iac/s0"),  # the smallest policy of the shape, an IAC method first
        ("dapo", "qwen3-8b/dapo_iac/s0"),
        ("dlc", "qwen3-8b/dapo_iac_dlc/s0"),
    ]
    two = PF.params(PAPER, "n2-gpu8")["canary"]
    assert [(c["kind"], c["run"]) for c in two] == [("plain", "qwen3-14b/iac/s0")]  # two nodes, 16 ranks a role
    for c in one + two:
        run = G.Run(*c["run"].split("/")[:2], 0)
        real = G.train_params(PAPER, run)
        # the run's method, batch, layout and inputs; only its length and response budget cut
        assert c["settings"]["method"] == real["method"] and c["resources"] == G.resources(PAPER, run)
        assert c["inputs"] == G.inputs(PAPER, run) and c["settings"]["run"].startswith("preflight-canary/")
        cut = {"steps": 3, "eval_every": 2, "max_new_tokens": 1024}
        assert c["settings"]["train"] == {**real["train"], **cut}
        assert {k: v for k, v in c["settings"].items() if k not in ("run", "train")} == {
            k: v for k, v in real.items() if k not in ("run", "train")
        }
    # the preflight job waits for the data and models of every run the canary may pick (the DAG cannot size models)
    assert set(PF.inputs(PAPER, "n1-gpu8")) >= {p for c in one for p in c["inputs"].values()}
    assert "models/qwen3-14b/hub.json" not in PF.inputs(PAPER, "n1-gpu8")
    # evaluation-only shapes train nothing
    engines_only = copy.deepcopy(PAPER)
    engines_only["grid"]["eval"]["data_parallel_size"] = 4
    assert PF.params(engines_only, "n1-gpu4")["canary"] == [] and PF.inputs(engines_only, "n1-gpu4") == []


def test_the_canary_runs_last_and_is_waivable_by_name(tmp_path):
    """Waived, the canary is not run (the one check that costs a training run), and its shape's preflight needs no
    training data."""
    assert list(PF.all_checks("openrlhf"))[-1] == "canary"
    cfg = copy.deepcopy(PAPER)
    cfg["grid"]["preflight"]["waive"] = ["canary"]
    from calibrl.config import problems

    assert problems(cfg) == []
    assert PF.params(cfg, "n1-gpu8")["canary"] == [] and PF.inputs(cfg, "n1-gpu8") == []
    p = {"shape": "n1-gpu8", "backend": "openrlhf", "checks": ["canary"], "waive": ["canary"], "canary": [{}]}
    assert PF.run_checks(p) == [
        {"check": "canary", "status": "waived", "detail": "not run (grid.preflight.waive)", "fix": "", "seconds": 0.0}
    ]
    cfg["grid"]["preflight"]["canary"] = {"max_new_tokens": 0}
    assert [k for k, _ in problems(cfg)] == ["grid.preflight.canary.max_new_tokens"]


@pytest.mark.parametrize(
    "tail, meaning",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "a GPU ran out of memory"),
        (  # Ray's memory monitor (a verl rehearsal's canary beside leaked engines): host memory, not a GPU's
            "ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low on memory.\n"
            "(raylet) Refer to the documentation on how to address the out of memory issue",
            "host memory ran low",
        ),
        ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error", "NCCL collective failed"),
        ("calibrl...DivergenceCheckFailed: DLC at step 1: the engines' sampling logprobs differ", "another distri"),
        ("ERROR calibrl.gpu.watchdog: the's trainer of m/dlc/s0: no progress for 61.0 min (limit 60.0 min)", "no step"),
        ("ValueError: something else went wrong", "last error line: ValueError: something else"),
    ],
)
def test_a_failed_segment_is_named_by_what_its_log_says(tmp_path, tail, meaning):
    log = tmp_path / "segment_2.log"
    log.write_text("ray_cluster.sh: head up\nGlobal step 1: {...}\n" + tail + "\n")
    cause, fix = canary._cause(log)
    assert meaning in cause and fix


@pytest.mark.parametrize("trainer", ["openrlhf", "verl"])
def test_a_failing_segment_fails_the_check_naming_kind_run_segment_and_log(tmp_path, trainer):
    """A canary whose training cannot start (no model where its settings point) fails as a named finding, through
    each GPU backend's own check."""
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["grid"]["trainer"] = trainer
    settings = copy.deepcopy(PF.params(filled(cfg), "n2-gpu8")["canary"][0])
    assert settings["settings"]["backend"] == trainer
    p = {"canary": [settings], "results": str(tmp_path), "shape": "n2-gpu8", "workers": 0}
    (tmp_path / "data" / "d0").mkdir(parents=True)
    (tmp_path / "data" / "d0" / "train.jsonl").write_text("")
    (tmp_path / "models" / "qwen3-14b").mkdir(parents=True)
    (tmp_path / "nowhere").mkdir()  # an empty model folder
    (tmp_path / "models" / "qwen3-14b" / "hub.json").write_text('{"path": "%s"}' % (tmp_path / "nowhere"))
    with pytest.raises(CheckFailed) as err:
        backends.get(trainer).gpu.preflight_checks()["canary"](p)
    assert "canary plain (as qwen3-14b/iac/s0): training to step 2 failed" in err.value.cause
    assert str(tmp_path / "preflight" / "canary" / "n2-gpu8" / "plain" / "segment_2.log") in err.value.cause
