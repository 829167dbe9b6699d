"""DeepSpeed's resume state more often than the Hugging Face copies (a layout's ``ds_save_steps``).

OpenRLHF 0.11.2 saves both at every ``--ckpt.save_steps``: ``PolicyModelActor.save_checkpoint`` writes the DeepSpeed
tag, then the copy through ``DeepspeedStrategy.save_model`` into ``global_step{k}_hf``. The command sets
``--ckpt.save_steps`` to ``ds_save_steps``, so that a killed job of a long run repeats at most that many steps (a DLC
step of the 8B takes ~5 min: at the evaluation cadence of 50, ~4 h of 8 GPUs), and this patch skips the copy between
the evaluated steps (``grid.train.eval_every``), the only ones rule evaluate reads. Every rank skips alike (the
copy's ZeRO-3 gather is collective). ``resume`` resumes from a tag between evaluated steps, which has no copy. The DLC
memory's state follows ``--ckpt.save_steps`` (``dlc``). The patched class is a plain one, imported by reference in
every actor (``PolicyModelActor`` itself is a Ray actor class, pickled by value from the driver).
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from types import ModuleType

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.save_cadence")

SAVE_MODEL = Target(
    "openrlhf.utils.deepspeed.deepspeed",
    "DeepspeedStrategy.save_model",
    params=("self", "model", "tokenizer", "output_dir", "**kwargs"),
)
CALLER = Target("openrlhf.trainer.ray.ppo_actor", "PolicyModelActor.save_checkpoint", uses="f'{tag}_hf'")
TARGETS = (SAVE_MODEL, CALLER)
_COPY = re.compile(r"global_step(\d+)_hf")


def install(eval_every: int) -> None:
    """Write the Hugging Face copies only at multiples of ``eval_every`` once OpenRLHF's strategy is imported."""
    when_imported(SAVE_MODEL.module, functools.partial(patch, eval_every=int(eval_every)))


def patch(module: ModuleType, eval_every: int) -> None:
    def make(original):
        def save_model(self, model, tokenizer, output_dir, **kwargs):
            m = _COPY.fullmatch(Path(output_dir).name)
            if m and int(m[1]) % eval_every:
                return None  # a step saved for resuming only
            return original(self, model, tokenizer, output_dir, **kwargs)

        return save_model

    if SAVE_MODEL.wrap(module, "save_cadence", make):
        log.info("Hugging Face copies at every %d steps only (DeepSpeed's state at --ckpt.save_steps)", eval_every)
