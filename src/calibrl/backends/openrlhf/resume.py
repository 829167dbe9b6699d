"""What a killed OpenRLHF job leaves in ``{ckpt.path}``, and how the next segment makes it resumable.

OpenRLHF 0.11.2 saves step k in this order (``PolicyModelActor.save_checkpoint``, ppo_actor.py L661-683):

1. ``strategy.save_ckpt`` (utils/deepspeed/deepspeed.py L685-764): old tags rotated out, then DeepSpeed's
   ``save_checkpoint`` writes ``_actor/global_step{k}/`` and last ``_actor/latest`` (+ a barrier), then rank 0
   writes ``_actor/global_step{k}/metric.json``: a tag with ``metric.json`` is complete;
2. ``strategy.save_model`` writes ``global_step{k}_hf/``: config, weights, tokenizer files, ``tokenizer.json``
   last (transformers 5.15): a copy with ``tokenizer.json`` and weights is complete.

A job killed between 1 and 2 leaves ``latest`` at k and no usable copy of k; ``--ckpt.load_enable`` resumes at k
and never saves k again, so step k would have no checkpoint for ever and every retry fails. Killed inside 1, it
leaves a tag without ``metric.json`` that the next rotation counts as a checkpoint (and deletes the complete one
to make room). ``_actor`` without ``latest`` makes ``PPOTrainer.fit`` fail with ``KeyError: 'episode'``.

:func:`repair` puts the folder back to the newest step that is complete on both sides (its DeepSpeed tag, and its
Hugging Face copy or its evaluation marker: ``grid.retention`` removes evaluated copies; a step saved for resuming
only, between the evaluated ones, has no copy: ``save_cadence``): later and partial tags
and copies are removed, ``latest`` names that step, and the DLC memory's state of a later step goes with them
(``dlc_memory/global_step{k}``, saved per step by ``calibrl.backends.openrlhf.dlc``). Nothing complete is ever
removed except a DeepSpeed tag newer than the resume point, whose training is then repeated.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from calibrl.io import write_text

log = logging.getLogger("calibrl.openrlhf.resume")

ACTOR = "_actor"
MEMORY = "dlc_memory"
_TAG = re.compile(r"global_step(\d+)")
_HF = re.compile(r"global_step(\d+)_hf")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def hf_complete(path: Path) -> bool:
    """A Hugging Face copy with its weights and its last-written file, ``tokenizer.json``."""
    return (path / "tokenizer.json").is_file() and any((path / w).exists() for w in WEIGHTS)


def ds_complete(path: Path) -> bool:
    """A DeepSpeed tag whose save returned on every rank (OpenRLHF writes ``metric.json`` after it)."""
    return (path / "metric.json").is_file()


def _steps(folder: Path, pattern: re.Pattern) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    return {int(m[1]): p for p in folder.iterdir() if p.is_dir() and (m := pattern.fullmatch(p.name))}


def resume_step(ckpt: Path, marker_dir: Path, eval_every: int) -> int:
    """The newest step OpenRLHF can resume from and whose checkpoint is kept (0: none, train from scratch). A step
    between the evaluated ones (a layout's ``ds_save_steps``: ``save_cadence``) has no copy to wait for."""
    hf = _steps(ckpt, _HF)
    for step, tag in sorted(_steps(ckpt / ACTOR, _TAG).items(), reverse=True):
        copied = step in hf and hf_complete(hf[step]) or (marker_dir / f"step_{step}.done").exists()
        if ds_complete(tag) and (copied or step % eval_every):
            return step
    return 0


def repair(ckpt_dir: str | Path, marker_dir: str | Path, eval_every: int) -> list[str]:
    """Make ``ckpt_dir`` (OpenRLHF's ``--ckpt.path``) resume from :func:`resume_step`; returns what was done."""
    ckpt, actor = Path(ckpt_dir), Path(ckpt_dir) / ACTOR
    step = resume_step(ckpt, Path(marker_dir), int(eval_every))
    done = []

    def remove(path: Path, why: str) -> None:
        shutil.rmtree(path, ignore_errors=True)
        done.append(f"removed {path.name} ({why})")

    for k, path in _steps(ckpt, _HF).items():
        if k > step and not hf_complete(path):
            remove(path, "an incomplete Hugging Face copy")
    for k, path in _steps(actor, _TAG).items():
        if k > step:
            remove(path, "complete, but its Hugging Face copy is not" if ds_complete(path) else "an incomplete save")
    for k, path in _steps(ckpt / MEMORY, _TAG).items():
        if k > step:
            remove(path, f"the DLC memory of step {k}, after the resume point")
    if actor.is_dir():
        latest = actor / "latest"
        if step == 0:
            remove(actor, "no complete DeepSpeed state: training starts from scratch")
        elif not latest.is_file() or latest.read_text().strip() != f"global_step{step}":
            write_text(latest, f"global_step{step}")
            done.append(f"{ACTOR}/latest -> global_step{step}")
    for line in done:
        log.warning("resume repair in %s: %s", ckpt, line)
    return done
