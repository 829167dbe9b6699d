"""The step limit: OpenRLHF trains exactly up to the segment's last step, and never on a partial batch.

OpenRLHF 0.11.2 has no max-steps flag, and DAPO's dynamic filtering consumes a data-dependent number of prompts per
step, so the trainer actor is patched to stop once its ``global_step`` reaches the segment's end, which the
launcher writes to ``<run>/ckpt/segment.json`` (:func:`write_segment`) before Ray starts:

* ``SamplesGenerator.generate_samples`` returns "no samples, data exhausted" once the limit is reached (which ends
  ``PPOTrainer.fit``'s loops), and drops a batch smaller than one step's: the end of a pass over the data would
  otherwise make a smaller, misaligned optimizer step;
* ``BasePPOTrainer.train_step`` sets the stop when the step it returns reaches the limit;
* ``BasePPOTrainer.init_checkpoint_states`` sets it when a resumed checkpoint is already there.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from types import ModuleType

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.steps")

TRAINER = "openrlhf.trainer.ppo_trainer"
GENERATOR = "openrlhf.trainer.ppo_utils.samples_generator"
GENERATE = Target(GENERATOR, "SamplesGenerator.generate_samples", params=("self", "**generate_kwargs"))
TRAIN_STEP = Target(TRAINER, "BasePPOTrainer.train_step", params=("self", "rollout_samples", "global_step"))
INIT_STATES = Target(TRAINER, "BasePPOTrainer.init_checkpoint_states", params=("self",))
TARGETS = (GENERATE, TRAIN_STEP, INIT_STATES)
SEGMENT = Path("ckpt") / "segment.json"


def write_segment(run_dir: str | Path, stop_at: int) -> None:
    """Record the step this job's training stops at (the segment's end) for :func:`install` in the trainer."""
    from calibrl.io import write_json

    write_json(Path(run_dir) / SEGMENT, {"stop_at": int(stop_at)})


def install(run_dir: str | Path) -> None:
    """Stop OpenRLHF's trainer at the step :func:`write_segment` recorded for ``run_dir``."""
    limit = int(json.loads((Path(run_dir) / SEGMENT).read_text())["stop_at"])
    when_imported(GENERATOR, functools.partial(patch_generator, limit=limit))
    when_imported(TRAINER, functools.partial(patch_trainer, limit=limit))


def patch_generator(module: ModuleType, limit: int) -> None:
    def make(original):
        def generate_samples(self, **kwargs):
            if getattr(self, "_calibrl_stop", False):
                return [], None, 0, True
            samples, pass_rate, consumed, exhausted = original(self, **kwargs)
            full = self.args.rollout.batch_size * self.args.rollout.n_samples_per_prompt
            if samples and len(samples) < full:
                log.warning("dropping a partial batch of %d samples (a step takes %d)", len(samples), full)
                samples = []
            return samples, pass_rate, consumed, exhausted

        return generate_samples

    GENERATE.wrap(module, "steps", make)


def patch_trainer(module: ModuleType, limit: int) -> None:
    def stop(self, step: int) -> None:
        if step >= limit:
            self.samples_generator._calibrl_stop = True
            log.info("step limit %d reached at step %d: stopping", limit, step)

    def train_step(original):
        def wrapped(self, rollout_samples, global_step):
            status, step = original(self, rollout_samples, global_step)
            stop(self, step)
            return status, step

        return wrapped

    def init_checkpoint_states(original):
        def wrapped(self):
            states = original(self)
            stop(self, int(states.get("global_step", 0)))
            return states

        return wrapped

    TRAIN_STEP.wrap(module, "steps", train_step)
    INIT_STATES.wrap(module, "steps", init_checkpoint_states)
