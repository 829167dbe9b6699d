"""Faults the CPU rehearsal injects into a training job, at a named point, once: what a preemption or a node failure
does to a job, made deterministic so a test can rerun the job and check that it resumes.

``CALIBRL_REHEARSAL_FAULTS`` lists ``<run>:<kind>:<step>`` entries (comma-separated; ``<run>`` as
``calibrl.runs.Run.path``, e.g. ``tiny-policy/grpo/s0``). Kinds:

* ``mid_step``: inside OpenRLHF's ``BasePPOTrainer.train_step`` of global step ``<step>``, after its rollout and
  before its policy update;
* ``before_hf``: after DeepSpeed saved step ``<step>`` and before OpenRLHF's Hugging Face copy of it
  (``DeepspeedStrategy.save_model`` into ``global_step<step>_hf``; ``resume`` describes what that leaves).

The fault kills the job's driver (``launch.main``, SIGKILL): ``ray_cluster.sh`` then stops Ray and the job fails,
as a killed job does, and SLURM and Snakemake's retry run the same command again. Each fault fires once: a marker
in ``<run>/rehearsal_faults/`` records that it has. Installed by the setup hook only on a rehearsal run
(``cpu_standins.enabled``); the launcher refuses the variable anywhere else.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from pathlib import Path
from types import ModuleType

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.rehearsal_faults")

ENV = "CALIBRL_REHEARSAL_FAULTS"
DRIVER_ENV = "CALIBRL_DRIVER_PID"
TRAIN_STEP = Target(
    "openrlhf.trainer.ppo_trainer", "BasePPOTrainer.train_step", params=("self", "rollout_samples", "global_step")
)
SAVE_MODEL = Target(
    "openrlhf.utils.deepspeed.deepspeed",
    "DeepspeedStrategy.save_model",
    params=("self", "model", "tokenizer", "output_dir", "**kwargs"),
)
TARGETS = (TRAIN_STEP, SAVE_MODEL)
KINDS = ("mid_step", "before_hf")
TAG = "rehearsal_fault"


def parse(value: str, run: str) -> dict[str, int]:
    """``kind -> step`` of the faults ``value`` names for ``run``; a malformed entry raises naming it."""
    out = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        path, _, rest = entry.rpartition(":")
        where, _, kind = path.rpartition(":")
        if kind not in KINDS or not rest.isdigit() or not where:
            raise ValueError(f"{ENV}: {entry!r} is not <run>:<{'|'.join(KINDS)}>:<step>")
        if where == run:
            out[kind] = int(rest)
    return out


def install(run_dir: str | Path, run: str) -> None:
    faults = parse(os.environ.get(ENV, ""), run)
    if not faults:
        return
    marks = Path(run_dir) / "rehearsal_faults"
    if "mid_step" in faults:
        when_imported(TRAIN_STEP.module, functools.partial(_patch_step, step=faults["mid_step"], marks=marks))
    if "before_hf" in faults:
        when_imported(SAVE_MODEL.module, functools.partial(_patch_save, step=faults["before_hf"], marks=marks))


def _fire(marks: Path, name: str) -> None:
    mark = marks / name
    if mark.exists():
        return
    marks.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"{time.time()}\n")
    pid = int(os.environ[DRIVER_ENV])
    log.warning("rehearsal fault %s: killing the job's driver (pid %d)", name, pid)  # may not reach the log: the
    os.kill(pid, signal.SIGKILL)  # driver forwards it; the marker is the record
    time.sleep(3600)  # this actor goes with the job's Ray cluster


def _patch_step(module: ModuleType, step: int, marks: Path) -> None:
    def make(original):
        def train_step(self, rollout_samples, global_step):
            if global_step + 1 == step:  # OpenRLHF passes the step before this one's update
                _fire(marks, f"mid_step-{step}")
            return original(self, rollout_samples, global_step)

        return train_step

    TRAIN_STEP.wrap(module, TAG, make)


def _patch_save(module: ModuleType, step: int, marks: Path) -> None:
    def make(original):
        def save_model(self, model, tokenizer, output_dir, **kwargs):
            if Path(output_dir).name == f"global_step{step}_hf":
                _fire(marks, f"before_hf-{step}")
            return original(self, model, tokenizer, output_dir, **kwargs)

        return save_model

    SAVE_MODEL.wrap(module, TAG, make)
