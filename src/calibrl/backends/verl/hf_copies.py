"""The Hugging Face copies that evaluation reads, beside verl's resume states.

verl saves its resume state every ``trainer.save_freq`` steps with a Hugging Face copy (``save_contents`` has
``hf_model``) in ``global_step_{k}/actor/huggingface``, which its rotation deletes with the state. At the evaluated
steps that copy is moved to ``hf/global_step{k}_hf`` (one rename, after verl's save); at the others it is removed.
The launcher writes the run's checkpoint markers from ``hf/`` (``launch``).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from calibrl.checkpoints import RunStamp
from calibrl.runs import checkpoint_steps

log = logging.getLogger("calibrl.verl.hf_copies")

HF = "hf"
"""The evaluated Hugging Face checkpoints, under verl's ``default_local_dir``: ``hf/global_step{k}_hf``."""


def hf_target(ckpt: str | Path, step: int) -> Path:
    return Path(ckpt) / HF / f"global_step{int(step)}_hf"


def keep_hf(ckpt: str | Path, step: int, evaluated: set[int]) -> Path | None:
    """Move the Hugging Face copy verl saved with step ``step``'s state to :func:`hf_target` if ``step`` is evaluated,
    else remove it; returns where it went (None: removed, or none there). Idempotent."""
    saved = Path(ckpt) / f"global_step_{int(step)}" / "actor" / "huggingface"
    target = hf_target(ckpt, step)
    if not saved.is_dir():
        return target if target.is_dir() else None
    if step not in evaluated:
        shutil.rmtree(saved)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a copy an earlier attempt moved: this one is the same step's, saved again
        shutil.rmtree(target)
    os.replace(saved, target)
    log.info("step %d: the Hugging Face checkpoint is %s", step, target)
    return target


def evaluated_steps(stamp: RunStamp) -> set[int]:
    return set(checkpoint_steps(int(stamp.train["eval_every"]), int(stamp.train["steps"])))
