"""The run's verl trainer: verl 0.9.1's synchronous v1 trainer (``PPOTrainerSync``) with what the paper's methods add,
registered as trainer mode ``calibrl`` (``command.TRAINER``) by the external module when verl's v1 trainers load.

* IAC counts successes by correctness (Section 3.1): verl's ``_compute_advantage`` hands an estimator the shaped
  ``rm_scores`` only (DAPO: +-1 plus the overlong penalty), so the step's ``acc`` (reward.py's 0/1 correctness,
  stored beside the scores in TransferQueue) is read for the same keys, in the same order, and given to the IAC
  estimators (``advantage.successes``) around verl's own computation.
* The evaluated checkpoints: after each of verl's saves, its Hugging Face copy is kept at the evaluated steps and
  removed at the others (``hf_copies.keep_hf``).
* DLC: the memory network's step after each policy step, its weights in the rollout engines, its save and resume
  (``dlc``).
* A CPU rehearsal's faults (``calibrl.gpu.faults``): ``mid_step``, ``dead_engine`` and ``hang`` before step k's policy
  update, ``before_hf`` after verl saved step k's state and before its Hugging Face copy is moved.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from calibrl.backends.verl.hf_copies import evaluated_steps, keep_hf
from calibrl.checkpoints import SETTINGS_ENV, RunStamp
from calibrl.gpu import faults

log = logging.getLogger("calibrl.verl.trainer")


def correctness(extra_fields) -> float:
    """A trajectory's 0/1 correctness, ``acc`` of the reward's extra info (reward.py), where verl 0.9.1's agent loop
    stores it (``extra_fields["reward_extra_info"]``, as its replay buffer reads DAPO's metric)."""
    fields = getattr(extra_fields, "data", extra_fields)
    info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
    if "acc" not in info:
        raise RuntimeError(f"IAC: no 'acc' in a trajectory's reward extra info ({sorted(info)}): the reward function "
                           "is calibrl.backends.verl.reward's, which returns it")  # fmt: skip
    return float(info["acc"])


def register() -> None:
    """Define the trainer class on verl's and register it as ``command.TRAINER`` (called once verl's v1 trainers are
    imported, ``external``)."""
    import numpy as np
    import torch
    import transfer_queue as tq
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from calibrl.backends.verl import advantage
    from calibrl.backends.verl.command import TRAINER

    if TRAINER in TRAINER_REGISTRY:
        return
    if RunStamp.read(os.environ[SETTINGS_ENV]).method.uses_dlc:
        from calibrl.backends.verl import dlc

        dlc.install_trainer_side()  # the groups DAPO's filter drops reach the memory too (Algorithm 1 line 22)

    class PPOTrainerCalibrl(PPOTrainerSync):
        def __init__(self, config):
            super().__init__(config)
            self.stamp = RunStamp.read(os.environ[SETTINGS_ENV])
            self.evaluated = evaluated_steps(self.stamp)
            self.dlc = None
            self.faults = faults.parse(os.environ.get(faults.ENV, ""), self.stamp.run)
            self.marks = Path(os.environ[SETTINGS_ENV]).parent / "rehearsal_faults"

        def _build_replay_buffer(self):
            # verl keys its sync/async behaviour on the mode's name (the replay buffer, the refill, what a checkpoint
            # holds): this trainer is the synchronous one under another name
            self.trainer_mode = "sync"
            return super()._build_replay_buffer()

        def init(self):
            super().init()
            if self.stamp.method.uses_dlc:
                from calibrl.backends.verl.dlc import DLC

                self.dlc = DLC(self, self.stamp)
                self.dlc.start(int(self.global_steps), self.config.trainer.default_local_dir)

        def _compute_advantage(self, batch, metrics):
            if not self.stamp.method.uses_iac:
                return super()._compute_advantage(batch, metrics)
            got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
            acc = torch.as_tensor(np.asarray([correctness(f) for f in got["extra_fields"]], dtype=np.float32))
            with advantage.successes(acc > 0.5):
                return super()._compute_advantage(batch, metrics)

        def step(self, metrics, timing_raw):
            batch = super().step(metrics, timing_raw)
            if self.dlc is not None:
                self.dlc.after_step(batch, metrics)
            return batch

        def _update_actor(self, batch, metrics):
            if self.faults.get("mid_step") == self.global_steps:
                faults.fire(self.marks, f"mid_step-{self.global_steps}")
            if self.faults.get("dead_engine") == self.global_steps:
                faults.kill_engines(self.marks, f"dead_engine-{self.global_steps}")
            if self.faults.get("hang") == self.global_steps:
                faults.hang(self.marks, f"hang-{self.global_steps}")
            return super()._update_actor(batch, metrics)

        def on_step_end(self):
            super().on_step_end()  # the policy's new weights in the engines
            if self.dlc is not None:
                self.dlc.after_sync(self.global_steps)

        def _save_checkpoint(self):
            ckpt = self.config.trainer.default_local_dir
            if self.dlc is not None:  # before verl's tracker names the step: a resumed step has its memory
                self.dlc.save(int(self.global_steps), ckpt)
            super()._save_checkpoint()
            if self.faults.get("before_hf") == self.global_steps:
                faults.fire(self.marks, f"before_hf-{self.global_steps}")
            keep_hf(ckpt, self.global_steps, self.evaluated)

    register_trainer(TRAINER)(PPOTrainerCalibrl)
