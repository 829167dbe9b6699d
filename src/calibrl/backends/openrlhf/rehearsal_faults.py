"""The rehearsal's faults (``calibrl.gpu.faults``: ``<run>:<kind>:<step>`` in ``CALIBRL_REHEARSAL_FAULTS``) at
OpenRLHF's points:

* ``mid_step``: inside OpenRLHF's ``BasePPOTrainer.train_step`` of global step ``<step>``, after its rollout and
  before its policy update;
* ``before_hf``: after DeepSpeed saved step ``<step>`` and before OpenRLHF's Hugging Face copy of it
  (``DeepspeedStrategy.save_model`` into ``global_step<step>_hf``; ``resume`` describes what that leaves).

Installed by the setup hook only on a rehearsal run (``cpu_standins.enabled``); the launcher refuses the variable
anywhere else.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from types import ModuleType

from calibrl.gpu.faults import DRIVER_ENV, ENV, KINDS, fire, parse
from calibrl.gpu.patching import Target, when_imported

__all__ = ["DRIVER_ENV", "ENV", "KINDS", "install", "parse"]
TRAIN_STEP = Target(
    "openrlhf.trainer.ppo_trainer", "BasePPOTrainer.train_step", params=("self", "rollout_samples", "global_step")
)
SAVE_MODEL = Target(
    "openrlhf.utils.deepspeed.deepspeed",
    "DeepspeedStrategy.save_model",
    params=("self", "model", "tokenizer", "output_dir", "**kwargs"),
)
TARGETS = (TRAIN_STEP, SAVE_MODEL)
TAG = "rehearsal_fault"


def install(run_dir: str | Path, run: str) -> None:
    faults = parse(os.environ.get(ENV, ""), run)
    if not faults:
        return
    if unknown := sorted(set(faults) - {"mid_step", "before_hf"}):
        raise ValueError(f"{ENV}: OpenRLHF's rehearsal injects mid_step and before_hf, not {unknown}")
    marks = Path(run_dir) / "rehearsal_faults"
    if "mid_step" in faults:
        when_imported(TRAIN_STEP.module, functools.partial(_patch_step, step=faults["mid_step"], marks=marks))
    if "before_hf" in faults:
        when_imported(SAVE_MODEL.module, functools.partial(_patch_save, step=faults["before_hf"], marks=marks))


def _patch_step(module: ModuleType, step: int, marks: Path) -> None:
    def make(original):
        def train_step(self, rollout_samples, global_step):
            if global_step + 1 == step:  # OpenRLHF passes the step before this one's update
                fire(marks, f"mid_step-{step}")
            return original(self, rollout_samples, global_step)

        return train_step

    TRAIN_STEP.wrap(module, TAG, make)


def _patch_save(module: ModuleType, step: int, marks: Path) -> None:
    def make(original):
        def save_model(self, model, tokenizer, output_dir, **kwargs):
            if Path(output_dir).name == f"global_step{step}_hf":
                fire(marks, f"before_hf-{step}")
            return original(self, model, tokenizer, output_dir, **kwargs)

        return save_model

    SAVE_MODEL.wrap(module, TAG, make)
