"""``grid.retention`` for the GPU backends' evaluated checkpoints: Hugging Face folders named ``global_step{k}_hf``."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger("calibrl.gpu.retention")
STEP_DIR = re.compile(r"global_step(\d+)_hf")


def release_hf(policy_dir: str, step: int, keep_steps: list[int]) -> bool:
    """Remove an evaluated Hugging Face checkpoint (``global_step{k}_hf``) unless it is the newest of its run or
    ``keep_steps`` names it (``grid.retention``). Its marker stays: training counts the step as done, and an
    evaluation that needs it again says that it was removed. Returns whether it was removed."""
    path = Path(policy_dir)
    m = STEP_DIR.fullmatch(path.name)
    if not m or not path.is_dir():
        return False
    newest = max((int(n[1]) for p in path.parent.iterdir() if (n := STEP_DIR.fullmatch(p.name))), default=step)
    if step in keep_steps or step >= newest:
        return False
    shutil.rmtree(path)
    log.info("removed the evaluated checkpoint of step %d (%s); grid.retention keeps %s and the newest",
             step, path, keep_steps)  # fmt: skip
    return True
