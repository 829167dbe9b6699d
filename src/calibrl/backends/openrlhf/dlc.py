"""DLC inside OpenRLHF 0.11.2: the composite engines, the memory actor's step after every policy step, its sync.

Installed by the setup hook (``hook.patches``) for a run whose method uses DLC, in each process where the
patched module is imported:

* ``openrlhf.trainer.ray.vllm_engine`` (the ``RolloutRayActor`` processes): the ``vllm.AsyncEngineArgs`` that
  ``RolloutRayActor.__init__`` builds its engine from gets ``hf_overrides`` selecting
  ``vllm_dlc.DLCQwen3ForCausalLM`` (policy checkpoint + memory checkpoint + mu) and ``DLCWorkerWrap`` as the worker
  extension. OpenRLHF builds the engine args itself, with no CLI for extra keys, hence this patch.
* ``openrlhf.trainer.ppo_utils.samples_generator``: every response turned into an experience is recorded
  (``_process_response_into_experience``), before DAPO's filter drops a group, so the memory learns from all
  sampled groups (Algorithm 1 line 22); vLLM is asked for the sampled token's logprob (``logprobs=1``, one number
  per token) for the divergence check.
* ``openrlhf.trainer.ppo_trainer``: ``init_checkpoint_states`` starts the memory actor (one GPU), resumes it from
  ``{ckpt.path}/dlc_memory/global_step{k}`` (the resumed policy's step k) when the run resumes, and broadcasts its
  weights to the engines; ``train_step``, after the policy's step and broadcast, runs the divergence check when the
  rollout policy is a saved checkpoint (step 1 and the step after each ``global_step{k}_hf``), takes the memory's
  cross-entropy step on everything recorded, broadcasts ``memory.*`` to every engine, saves the memory at every
  saved step (kept while DeepSpeed keeps the policy's state of that step), and logs ``dlc/memory_loss`` and
  ``dlc/check_*``.

The memory's weights travel like the policy's: ``DLCWorkerWrap`` keeps a second process group (name
``MEMORY_GROUP``) beside OpenRLHF's and routes ``update_weight("memory.*")`` through it. Not testable on CPU:
this path needs GPUs, NCCL and DeepSpeed; ``memory_actor`` and ``vllm_dlc`` are tested on CPU.
"""

from __future__ import annotations

import functools
import logging
import shutil
from pathlib import Path
from types import ModuleType

from calibrl.backends.openrlhf.patching import Target, when_imported
from calibrl.backends.openrlhf.resume import ACTOR, MEMORY

log = logging.getLogger("calibrl.openrlhf.dlc")

ENGINE = "openrlhf.trainer.ray.vllm_engine"
GENERATOR = "openrlhf.trainer.ppo_utils.samples_generator"
TRAINER = "openrlhf.trainer.ppo_trainer"
ENGINE_ARGS = Target(ENGINE, "RolloutRayActor.__init__", uses="vllm.AsyncEngineArgs(")
PROCESS = Target(GENERATOR, "SamplesGenerator._process_response_into_experience")
SAMPLING_PARAMS = Target(GENERATOR, "SamplingParams")
INIT_STATES = Target(TRAINER, "BasePPOTrainer.init_checkpoint_states")
TRAIN_STEP = Target(TRAINER, "BasePPOTrainer.train_step")
WORKER_WRAP = Target("openrlhf.trainer.ray.vllm_worker_wrap", "WorkerWrap.init_process_group")
UPDATE_WEIGHT = Target("openrlhf.trainer.ray.vllm_worker_wrap", "WorkerWrap.update_weight")
BATCH_CALL = Target(ENGINE, "batch_vllm_engine_call")
PROCESS_GROUP = Target("openrlhf.utils.distributed_util", "stateless_init_process_group")
TARGETS = (
    ENGINE_ARGS,
    PROCESS,
    SAMPLING_PARAMS,
    INIT_STATES,
    TRAIN_STEP,
    WORKER_WRAP,
    UPDATE_WEIGHT,
    BATCH_CALL,
    PROCESS_GROUP,
)
MEMORY_GROUP = "calibrl_dlc_memory"
CHECK_SEQUENCES = 4
TAG = "dlc"


def install(memory_path: str, mu: float, lr: float) -> None:
    """Register the three patches: sampling from the composite at ``mu``, the memory (``memory_path``) trained at
    ``lr`` after every step."""
    if not mu > 0 or not lr > 0:
        raise ValueError(f"DLC needs mu > 0 and a memory learning rate > 0, got {mu}, {lr}")
    when_imported(ENGINE, functools.partial(patch_engines, memory_path=memory_path, mu=mu))
    when_imported(GENERATOR, patch_generator)
    when_imported(TRAINER, functools.partial(patch_trainer, memory_path=memory_path, mu=mu, lr=lr))


# -------------------------------------------------------------------------------------------- engines
def patch_engines(module: ModuleType, memory_path: str, mu: float) -> None:
    from calibrl.backends.openrlhf.vllm_dlc import engine_kwargs

    ENGINE_ARGS.resolve(module)
    vllm = module.vllm
    base = vllm.AsyncEngineArgs
    if TAG in getattr(base, "__calibrl_patch__", frozenset()):
        return

    def make(*args, **kwargs):
        kwargs.update(engine_kwargs(memory_path, mu))
        kwargs["worker_extension_cls"] = f"{__name__}.DLCWorkerWrap"
        return base(*args, **kwargs)

    make.__calibrl_patch__ = frozenset({TAG})
    vllm.AsyncEngineArgs = make  # read as vllm.AsyncEngineArgs by RolloutRayActor.__init__


def _make_worker_wrap():
    from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap

    class DLCWorkerWrap(WorkerWrap):
        """OpenRLHF's ``WorkerWrap`` with a second weight-sync group for the memory (``memory.*`` names)."""

        def init_process_group(
            self, master_address, master_port, rank_offset, world_size, group_name, backend="nccl", use_ray=False
        ):
            args = (master_address, master_port, rank_offset, world_size, group_name, backend, use_ray)
            if group_name != MEMORY_GROUP:
                return super().init_process_group(*args)
            saved = getattr(self, "_model_update_group", None), getattr(self, "_model_update_with_ray", False)
            super().init_process_group(*args)
            self._memory_group = self._model_update_group, self._model_update_with_ray
            self._model_update_group, self._model_update_with_ray = saved

        def update_weight(self, name, dtype, shape, empty_cache=False):
            if not name.startswith("memory."):
                return super().update_weight(name, dtype, shape, empty_cache)
            saved = self._model_update_group, self._model_update_with_ray
            self._model_update_group, self._model_update_with_ray = self._memory_group
            try:
                return super().update_weight(name, dtype, shape, empty_cache)
            finally:
                self._model_update_group, self._model_update_with_ray = saved

    return DLCWorkerWrap


def __getattr__(name: str):
    # vLLM resolves worker_extension_cls by name in the worker; OpenRLHF's WorkerWrap is imported only then.
    if name == "DLCWorkerWrap":
        return _make_worker_wrap()
    raise AttributeError(name)


# ------------------------------------------------------------------------------------------ generator
def patch_generator(module: ModuleType) -> None:
    def process(original):
        def _process_response_into_experience(self, response, **kwargs):
            experience = original(self, response, **kwargs)
            self.__dict__.setdefault("_calibrl_dlc_seen", []).append(experience)
            return experience

        return _process_response_into_experience

    def sampling_params(original):
        def make(*args, **kwargs):
            if kwargs.get("logprobs") is None:
                kwargs["logprobs"] = 1  # the sampled token's logprob, for the divergence check
            return original(*args, **kwargs)

        return make

    PROCESS.wrap(module, TAG, process)
    SAMPLING_PARAMS.wrap(module, TAG, sampling_params)


def tokens_of(experience):
    """(tokens, response mask over tokens, sampling logprobs over tokens or None) of a one-sample experience."""
    import torch

    seq = experience.sequences[0]
    learn = torch.cat([torch.zeros(1, dtype=torch.bool), experience.action_mask[0].bool()])
    lp = experience.rollout_log_probs
    lp = None if lp is None else torch.cat([torch.zeros(1), lp[0].float()])
    return seq, learn, lp


# -------------------------------------------------------------------------------------------- trainer
def patch_trainer(module: ModuleType, memory_path: str, mu: float, lr: float) -> None:
    def init_states(original):
        def init_checkpoint_states(self):
            states = original(self)
            _start_memory(self, int(states.get("global_step", 0)), memory_path, lr)
            return states

        return init_checkpoint_states

    def step(original):
        def train_step(self, rollout_samples, global_step):
            status, new_step = original(self, rollout_samples, global_step)
            status.update(_memory_step(self, global_step, new_step, mu))
            return status, new_step

        return train_step

    INIT_STATES.wrap(module, TAG, init_states)
    TRAIN_STEP.wrap(module, TAG, step)


def _memory_dir(self, step: int) -> Path:
    """The memory's state of ``step``, one per saved policy step: a resumed run (``resume.repair`` may rewind the
    policy to an earlier tag) takes the memory of the same step."""
    return Path(self.args.ckpt.path) / MEMORY / f"global_step{step}"


def _prune_memory(self, keep: int) -> None:
    """Drop the memory states whose policy tag DeepSpeed rotated out (``--ckpt.max_num``), except ``keep``."""
    root = Path(self.args.ckpt.path)
    tags = {p.name for p in (root / ACTOR).iterdir()} if (root / ACTOR).is_dir() else set()
    for path in (root / MEMORY).glob("global_step*"):
        if path.name not in tags and path.name != f"global_step{keep}":
            shutil.rmtree(path, ignore_errors=True)


def _start_memory(self, global_step: int, memory_path: str, lr: float) -> None:
    import ray

    from calibrl.backends.openrlhf.memory_actor import actor

    # float32 master weights: AdamW steps of lr ~1e-6 vanish in bfloat16; the engines get bfloat16 copies
    self._calibrl_memory = memory = actor(memory_path, lr, dtype="float32")
    if global_step:
        state = _memory_dir(self, global_step)
        if not state.is_dir():
            raise RuntimeError(
                f"DLC: the policy resumes at step {global_step} but {state} is missing; the memory network would "
                f"restart from its initial weights. Move the run aside to retrain it, or restore that folder."
            )
        resumed = ray.get(memory.load.remote(str(state)))
        log.info("DLC memory resumed from %s (%d memory steps)", state, resumed)
    ray.get(memory.init_broadcast.remote(self.vllm_engines, self.args.vllm.tensor_parallel_size, MEMORY_GROUP))
    if self.args.vllm.enable_sleep:  # engines start asleep (create_vllm_engines); weights must be resident
        from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call

        batch_vllm_engine_call(self.vllm_engines, "wake_up", tags=["weights"])
    ray.get(memory.broadcast.remote(self.vllm_engines))


def _rollout_policy(self, global_step: int) -> str | None:
    """The checkpoint the engines sampled this step's rollouts with, when one is on disk."""
    if global_step == 0:
        return self.args.actor.model_name_or_path
    path = Path(self.args.ckpt.path) / f"global_step{global_step}_hf"
    return str(path) if path.is_dir() else None


def _memory_step(self, global_step: int, new_step: int, mu: float) -> dict:
    import ray

    memory = self._calibrl_memory
    seen = self.samples_generator.__dict__.pop("_calibrl_dlc_seen", [])
    if not seen:
        raise RuntimeError("DLC: no sampled responses were recorded for the memory step")
    triples = [tokens_of(e) for e in seen]
    out = {"dlc/memory_samples": float(len(triples))}
    policy = _rollout_policy(self, global_step)
    checked = [t for t in triples if t[2] is not None][:CHECK_SEQUENCES]
    if policy is not None and checked:
        stats = ray.get(memory.check.remote(policy, mu, *zip(*checked)))  # the memory used for sampling
        out.update({f"dlc/{k}": float(v) for k, v in stats.items()})
    out["dlc/memory_loss"] = ray.get(memory.step.remote([t[0] for t in triples], [t[1] for t in triples]))
    ray.get(memory.broadcast.remote(self.vllm_engines))
    if new_step % self.args.ckpt.save_steps == 0:  # before the policy's save of the same step (fit's order)
        ray.get(memory.save.remote(str(_memory_dir(self, new_step))))
        _prune_memory(self, new_step)
    return out
