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
* ``openrlhf.trainer.ray.launcher``: ``RayActorGroup`` remembers the placement group its actors went to, so the
  memory's ranks can join the colocated one.
* ``openrlhf.trainer.ppo_trainer``: ``init_checkpoint_states`` starts the memory group (``memory_group``: a rank
  on every GPU of a colocated run, or ``memory_gpus`` GPUs of its own), resumes it from
  ``{ckpt.path}/dlc_memory/global_step{k}`` (the resumed policy's step k) when the run resumes, and sends its
  weights to the engines; ``train_step`` runs the divergence check when the rollout policy is a saved checkpoint
  (step 1 and the step after each ``global_step{k}_hf``; waited for, at most ``CHECK_TIMEOUT_S``, before the
  memory's step, whose collectives the other ranks would otherwise wait in) and the memory's cross-entropy step on
  everything recorded: beside the policy's step when the memory has GPUs of its own, after it when it shares them
  (both are compute-bound there). Then ``memory.*`` goes to every engine, the memory is saved at every saved step (kept
  while DeepSpeed keeps the policy's state of that step), and ``dlc/memory_loss`` and ``dlc/check_*`` are logged.

The memory's weights travel like the policy's (OpenRLHF's rule, :func:`_cuda_ipc`): by CUDA IPC when colocated with
NCCL sync (``WorkerWrap.update_weight_cuda_ipc``,
the memory's rank on each GPU handing its copy to that GPU's engine), else through a second NCCL group (name
``MEMORY_GROUP``) that ``DLCWorkerWrap`` keeps beside OpenRLHF's (``memory_sync``). On CPU the rehearsal runs this
path with gloo in NCCL's place (``cpu_standins``); the shared parts (``calibrl.gpu``: ``memory_actor``,
``memory_group``, ``vllm_dlc``) are also tested on their own.
"""

from __future__ import annotations

import functools
import logging
import shutil
from pathlib import Path
from types import ModuleType

from calibrl.backends.openrlhf.resume import ACTOR, MEMORY
from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.dlc")

ENGINE = "openrlhf.trainer.ray.vllm_engine"
GENERATOR = "openrlhf.trainer.ppo_utils.samples_generator"
TRAINER = "openrlhf.trainer.ppo_trainer"
ENGINE_ARGS = Target(
    ENGINE,
    "RolloutRayActor.__init__",
    uses="vllm.AsyncEngineArgs(",
    params=("self", "*args", "bundle_indices", "agent_func_path", "remote_rm_url", "mm_pad_token_ids", "**kwargs"),
)
PROCESS = Target(
    GENERATOR, "SamplesGenerator._process_response_into_experience", params=("self", "response", "**generate_kwargs")
)
SAMPLING_PARAMS = Target(GENERATOR, "SamplingParams")
INIT_STATES = Target(TRAINER, "BasePPOTrainer.init_checkpoint_states", params=("self",))
TRAIN_STEP = Target(TRAINER, "BasePPOTrainer.train_step", params=("self", "rollout_samples", "global_step"))
WORKER_WRAP = Target(
    "openrlhf.trainer.ray.vllm_worker_wrap",
    "WorkerWrap.init_process_group",
    params=("self", "master_address", "master_port", "rank_offset", "world_size", "group_name", "backend", "use_ray"),
)
UPDATE_WEIGHT = Target(
    "openrlhf.trainer.ray.vllm_worker_wrap",
    "WorkerWrap.update_weight",
    params=("self", "name", "dtype", "shape", "empty_cache"),
)
BATCH_CALL = Target(
    ENGINE, "batch_vllm_engine_call", params=("engines", "method_name", "*args", "rank_0_only", "**kwargs")
)
PROCESS_GROUP = Target(
    "openrlhf.utils.distributed_util",
    "stateless_init_process_group",
    params=("master_address", "master_port", "rank", "world_size", "device"),
)
LAUNCHER = "openrlhf.trainer.ray.launcher"
ACTOR_GROUP = Target(LAUNCHER, "RayActorGroup._initiate_actors", params=("self", "pg", "num_gpus_per_actor"))
IPC_UPDATE = Target(
    "openrlhf.trainer.ray.vllm_worker_wrap",
    "WorkerWrap.update_weight_cuda_ipc",
    params=("self", "name", "dtype", "shape", "ipc_handles", "empty_cache"),
)
GPU_ID = Target("openrlhf.trainer.ray.utils", "get_physical_gpu_id", params=())
# The private state DLCWorkerWrap swaps to run a second weight-sync group: set by init_process_group, read by
# update_weight (OpenRLHF 0.11.2's WorkerWrap).
SYNC_GROUP_SET = Target("openrlhf.trainer.ray.vllm_worker_wrap", "WorkerWrap.init_process_group",
                        uses="self._model_update_group = stateless_init_process_group(")  # fmt: skip
SYNC_RAY_SET = Target("openrlhf.trainer.ray.vllm_worker_wrap", "WorkerWrap.init_process_group",
                      uses="self._model_update_with_ray = use_ray")  # fmt: skip
SYNC_READ = Target("openrlhf.trainer.ray.vllm_worker_wrap", "WorkerWrap.update_weight",
                   uses="if self._model_update_with_ray:")  # fmt: skip
# vLLM's engine arguments, which RolloutRayActor.__init__ reads as vllm.AsyncEngineArgs (a lazy attribute of vllm):
# replaced in its module by a factory (a class cannot be functools-wrapped), which sets two of its fields.
VLLM_ENGINE_ARGS = Target("vllm", "AsyncEngineArgs")  # the name replaced (resolved on the imported module)
ENGINE_ARGS_CLASS = Target("vllm.engine.arg_utils", "AsyncEngineArgs")  # where it is defined (checked)
HF_OVERRIDES = Target("vllm.engine.arg_utils", "EngineArgs", uses="hf_overrides: HfOverrides")
WORKER_EXTENSION = Target("vllm.engine.arg_utils", "EngineArgs", uses="worker_extension_cls: str")
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
    ACTOR_GROUP,
    IPC_UPDATE,
    GPU_ID,
    ENGINE_ARGS_CLASS,
    HF_OVERRIDES,
    WORKER_EXTENSION,
    SYNC_GROUP_SET,
    SYNC_RAY_SET,
    SYNC_READ,
)
MEMORY_GROUP = "calibrl_dlc_memory"
CHECK_SEQUENCES = 4
CHECK_TOLERANCE = 0.1
"""The most the engines' sampling logprobs may differ, on average per token, from ``log_softmax(f_theta - mu f_phi)``
recomputed by the memory actor: bfloat16 engines give a few 1e-2; 0.1 or more means they sample from another
distribution (a memory that did not reach them, another mu), and the run fails instead of training on it."""


CHECK_TIMEOUT_S = 1800.0
"""How long the trainer waits for the divergence check, by name (:func:`_await_check`). Rank 0 loads the rollout
policy (16.4 GB for Qwen3-8B) and the memory and recomputes ``CHECK_SEQUENCES`` sequences while the other ranks
idle: seconds to minutes, a file system permitting. The memory's step, whose collectives would otherwise hold the
other ranks under the process group's timeout (NCCL's 10 minutes) with an error that names no check, is submitted
only once every rank has returned from the check."""


class DivergenceCheckFailed(RuntimeError):
    """The engines do not sample from the DLC composite the run trains."""


class DivergenceCheckTimeout(RuntimeError):
    """The divergence check did not finish within :data:`CHECK_TIMEOUT_S`."""


TAG = "dlc"


def install(memory_path: str, mu: float, lr: float, decay: tuple[float, str], layout: dict) -> None:
    """Register the patches: sampling from the composite at ``mu``, the memory (``memory_path``) trained at ``lr``
    with ``decay`` (the run's weight decay and its scope) every step, placed as the run's ``layout`` says
    (``layout.roles``: colocated or ``memory_gpus``)."""
    if not mu > 0 or not lr > 0:
        raise ValueError(f"DLC needs mu > 0 and a memory learning rate > 0, got {mu}, {lr}")
    place = {
        "colocated": bool(layout["colocate_all"]),
        "gpus": int(layout["memory_gpus"]),  # the schema fills every layout key's default
        "max_tokens": int(layout["max_tokens_per_gpu"]),
        "weight_decay": float(decay[0]),
        "decay_scope": str(decay[1]),
    }
    when_imported(ENGINE, functools.partial(patch_engines, memory_path=memory_path, mu=mu))
    when_imported(GENERATOR, patch_generator)
    when_imported(LAUNCHER, patch_launcher)
    when_imported(TRAINER, functools.partial(patch_trainer, memory_path=memory_path, mu=mu, lr=lr, place=place))


def install_driver() -> None:
    """The driver's part: OpenRLHF builds its actor groups in the driver (``cli/train_ppo_ray.py``) and pickles them
    into the trainer actor, so the shared placement group is recorded there (Ray's setup hook never runs in the
    driver)."""
    when_imported(LAUNCHER, patch_launcher)


# -------------------------------------------------------------------------------------------- engines
def patch_engines(module: ModuleType, memory_path: str, mu: float) -> None:
    from calibrl.gpu.vllm_dlc import engine_kwargs

    ENGINE_ARGS.resolve(module)
    owner, attr, base = VLLM_ENGINE_ARGS.resolve(module.vllm)
    if TAG in getattr(base, "__calibrl_patch__", frozenset()):
        return

    def make(*args, **kwargs):
        kwargs.update(engine_kwargs(memory_path, mu))
        kwargs["worker_extension_cls"] = f"{__name__}.DLCWorkerWrap"
        return base(*args, **kwargs)

    make.__calibrl_patch__ = frozenset({TAG})
    setattr(owner, attr, make)  # read as vllm.AsyncEngineArgs by RolloutRayActor.__init__


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


# ------------------------------------------------------------------------------------------- launcher
def patch_launcher(module: ModuleType) -> None:
    def initiate(original):
        def _initiate_actors(self, pg, num_gpus_per_actor):
            self._calibrl_pg = pg  # the shared placement group of a colocated run (None: the group makes its own)
            return original(self, pg, num_gpus_per_actor)

        return _initiate_actors

    ACTOR_GROUP.wrap(module, TAG, initiate)


# -------------------------------------------------------------------------------------------- trainer
def patch_trainer(module: ModuleType, memory_path: str, mu: float, lr: float, place: dict) -> None:
    def init_states(original):
        def init_checkpoint_states(self):
            states = original(self)
            _start_memory(self, int(states.get("global_step", 0)), memory_path, lr, place)
            return states

        return init_checkpoint_states

    def step(original):
        def train_step(self, rollout_samples, global_step):
            # the memory's own GPUs: its step runs beside the policy's (both from this rollout); shared: after it
            pending = None if place["colocated"] else _memory_submit(self, global_step, mu)
            status, new_step = original(self, rollout_samples, global_step)
            if pending is None:
                pending = _memory_submit(self, global_step, mu)
            status.update(_memory_finish(self, pending, new_step, place["colocated"]))
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


def _start_memory(self, global_step: int, memory_path: str, lr: float, place: dict) -> None:
    import ray
    from ray.util.placement_group import placement_group

    from calibrl.backends.openrlhf.memory_sync import MemoryWorker
    from calibrl.gpu.memory_group import COLOCATED_SHARE, MemoryGroup, first

    if place["colocated"]:  # a rank in every bundle of the shared group, beside each GPU's engine
        pg = getattr(self.actor_model_group, "_calibrl_pg", None)
        if pg is None:
            raise RuntimeError("DLC (colocated): OpenRLHF's shared placement group was not recorded (patch_launcher)")
        ranks, share = len(pg.bundle_specs), COLOCATED_SHARE
    else:
        ranks, share = place["gpus"], 1.0
        pg = placement_group([{"GPU": 1, "CPU": 1}] * ranks, strategy="PACK")
        ray.get(pg.ready())
    memory = MemoryGroup(memory_path, lr, ranks, pg, share, worker=MemoryWorker, max_tokens=place["max_tokens"],
                         weight_decay=place["weight_decay"], decay_scope=place["decay_scope"])  # fmt: skip
    self._calibrl_memory = memory
    if global_step:
        state = _memory_dir(self, global_step)
        if not state.is_dir():
            raise RuntimeError(
                f"DLC: the policy resumes at step {global_step} but {state} is missing; the memory network would "
                f"restart from its initial weights. Move the run aside to retrain it, or restore that folder."
            )
        log.info("DLC memory resumed from %s (%d memory steps)", state, first(memory.load(str(state))))
    if not _cuda_ipc(self):
        ray.get(memory.each("init_broadcast", self.vllm_engines, self.args.vllm.tensor_parallel_size, MEMORY_GROUP))
    if self.args.vllm.enable_sleep:  # engines start asleep (create_vllm_engines); weights must be resident
        from openrlhf.trainer.ray.vllm_engine import batch_vllm_engine_call

        batch_vllm_engine_call(self.vllm_engines, "wake_up", tags=["weights"])
    ray.get(memory.each("broadcast", self.vllm_engines, _cuda_ipc(self)))


def _cuda_ipc(self) -> bool:
    """Whether the memory's weights go to the engines by CUDA IPC: exactly when the policy's do, by OpenRLHF's own
    rule (``PolicyModelActor``, ppo_actor.py L101: NCCL sync, colocated, not async); else the broadcast group."""
    args = self.args
    return args.vllm.sync_backend == "nccl" and args.train.colocate_all and not args.train.async_enable


def _rollout_policy(self, global_step: int) -> str | None:
    """The checkpoint the engines sampled this step's rollouts with, when one is on disk."""
    if global_step == 0:
        return self.args.actor.model_name_or_path
    path = Path(self.args.ckpt.path) / f"global_step{global_step}_hf"
    return str(path) if path.is_dir() else None


def _memory_submit(self, global_step: int, mu: float) -> dict:
    """Run the check where the rollout policy is on disk (with the memory the engines sampled with: before its
    step), waiting for it (:func:`_await_check`), then start the memory's step on this rollout."""
    memory = self._calibrl_memory
    seen = self.samples_generator.__dict__.pop("_calibrl_dlc_seen", [])
    if not seen:
        raise RuntimeError("DLC: no sampled responses were recorded for the memory step")
    triples = [tokens_of(e) for e in seen]
    policy = _rollout_policy(self, global_step)
    checked = [t for t in triples if t[2] is not None][:CHECK_SEQUENCES]
    check = None
    if policy is not None and checked:
        check = _await_check(memory.check(policy, mu, *zip(*checked)), global_step, policy)
    step = memory.step([t[0] for t in triples], [t[1] for t in triples])
    return {"samples": len(triples), "check": check, "step": step}


def _await_check(refs: list, step: int, policy: str) -> dict:
    """Rank 0's statistics of the divergence check once every rank has returned from it, within
    :data:`CHECK_TIMEOUT_S`; :class:`DivergenceCheckTimeout`, naming the check, when it has not. The other ranks
    return as soon as the memory's weights are gathered: no rank enters the memory step's collectives while
    rank 0 still checks."""
    import ray

    done, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
    if waiting:
        raise DivergenceCheckTimeout(
            f"DLC divergence check after step {step}: {len(waiting)} of {len(refs)} memory ranks had not finished "
            f"within {CHECK_TIMEOUT_S:g} s (dlc.CHECK_TIMEOUT_S); rank 0 loads the rollout policy {policy} and the "
            f"memory and recomputes {CHECK_SEQUENCES} sequences. A slow read of the checkpoint from the shared file "
            "system is the likely cause: the memory ranks' logs (Ray's worker logs) say how far it got"
        )
    return ray.get(refs)[0]


def checked(stats: dict, step: int) -> dict:
    """The divergence check's statistics (``vllm_dlc.divergence``) as ``dlc/check_*`` metrics; raises
    :class:`DivergenceCheckFailed` when their mean exceeds :data:`CHECK_TOLERANCE`."""
    out = {f"dlc/{k}": float(v) for k, v in stats.items()}
    mean, most = out["dlc/check_mean_abs"], out["dlc/check_max_abs"]
    log.info("DLC divergence check at step %d: mean |dlogp| %.4g, max %.4g (tolerance %g)", step, mean, most,
             CHECK_TOLERANCE)  # fmt: skip
    if not mean <= CHECK_TOLERANCE:  # NaN fails too
        raise DivergenceCheckFailed(
            f"DLC at step {step}: the engines' sampling logprobs differ from log_softmax(f_theta - mu f_phi) by "
            f"{mean:.4g} per token on average (max {most:.4g}), over the tolerance {CHECK_TOLERANCE}: the engines "
            "sample from another distribution than the one trained (memory weights not synced to them, another mu, "
            "another policy checkpoint)"
        )
    return out


def _memory_finish(self, pending: dict, new_step: int, colocated: bool) -> dict:
    import ray

    from calibrl.gpu.memory_group import first

    memory = self._calibrl_memory
    out = {"dlc/memory_samples": float(pending["samples"])}
    if pending["check"] is not None:  # rank 0's statistics, waited for in _memory_submit
        out.update(checked(pending["check"], new_step))
    out["dlc/memory_loss"] = first(pending["step"])
    ray.get(memory.each("broadcast", self.vllm_engines, _cuda_ipc(self)))
    if new_step % self.args.ckpt.save_steps == 0:  # before the policy's save of the same step (fit's order)
        ray.get(memory.save(str(_memory_dir(self, new_step))))
        _prune_memory(self, new_step)
    return out
