"""DLC inside verl 0.9.1 (Section 3.2, Algorithm 1): rollouts from the composite vLLM model, the memory's step after
each policy step, its weights in the rollout engines after every sync, its save and resume.

What it adds to verl, and where:

* The engines (``engine_overrides``, Hydra overrides of ``main_ppo``): verl's vLLM server (``vLLMHttpServer``
  ``.launch_server``) builds ``vllm serve`` arguments and lays ``rollout.engine_kwargs.vllm`` over them last, so
  ``hf_overrides`` selects ``calibrl.gpu.vllm_dlc.DLCQwen3ForCausalLM`` (policy checkpoint + memory checkpoint + mu;
  the class is registered in vLLM's processes by the package's ``vllm.general_plugins`` entry point) and
  ``worker_extension_cls`` replaces verl's ``vLLMColocateWorkerExtension`` with its subclass
  :func:`DLCWorkerExtension <_make_worker_extension>`.
* The policy's weights: verl's sync (``ServerAdapter.update_weights`` -> the worker's
  ``update_weights_from_ipc``: CUDA IPC on GPUs, shared memory where IPC is missing, as on CPU) ends in
  ``model.load_weights`` with the Hugging Face actor's names, which the composite routes to its policy stack
  (``memory.*`` names go to the memory); on CPU the composite keeps its linear weights and re-packs vLLM-CPU's GEMM
  handles before the next forward, so verl's in-place update works there (the plain CPU engine drops its weights
  after packing and verl's update fails: ``'Parameter' object has no attribute 'weight_loader'``).
* The memory's weights in the engines: the memory's rank 0 writes them (``memory.*`` names, the rollout's dtype) to
  one safetensors file per step in ``exchange_dir``; every vLLM worker is told the file by ``dlc_memory`` (verl's
  ``vLLMHttpServer.collective_rpc`` to the extension) and loads it **after every policy sync**
  (``update_weights_from_ipc``, wrapped): verl sleeps its hybrid engines at level 2 while FSDP trains, which
  discards every weight, and re-sends only the actor's, so the memory's are restored from the file each wake. Each
  worker records what it loaded (``loaded-*.json`` beside the file), which :meth:`DLC.after_sync` checks.
* The memory's training: :class:`DLC`, called by the run's trainer (``trainer.PPOTrainerCalibrl``, a subclass of
  verl's ``PPOTrainerSync``): ``start`` after verl's init (a ``calibrl.gpu.memory_group.MemoryGroup``, a rank in
  each bundle of verl's actor placement group, colocated; resumed from ``global_step_{k}/dlc_memory``),
  ``after_step`` at the end of verl's ``step`` (the step's trajectories read from TransferQueue, plus the groups
  DAPO's filter and the sync sampler's surplus dropped, recorded by a wrap of ``ReplayBuffer._clear_groups``; the
  divergence check where the rollout policy is on disk; one cross-entropy step; the new weights exported), ``save``
  in ``_save_checkpoint``, ``after_sync`` after ``on_step_end`` (verl's sync).

Every verl symbol it relies on is a :class:`calibrl.gpu.patching.Target`, checked (:func:`check`) when the DLC starts
and before anything is wrapped: another verl fails naming the symbol (:class:`VerlTargetMissing`).

Module-level imports are the standard library's and calibrl's only: the main venv plans verl runs without verl.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from calibrl.gpu.patching import PatchTargetMissing, Target

log = logging.getLogger("calibrl.verl.dlc")

VERL_PINNED = "0.9.1"
ARCH = "DLCQwen3ForCausalLM"  # calibrl.gpu.vllm_dlc.ARCH (not imported: that module imports torch)
MEMORY = "dlc_memory"  # the memory's state in verl's global_step_{k}/ folder
EXCHANGE = "dlc_exchange"  # default exchange folder, under verl's default_local_dir
TAG = "calibrl_dlc"
CHECK_SEQUENCES = 4
CHECK_TOLERANCE = 0.1
"""The most the engines' sampling logprobs may differ, on average per token, from ``log_softmax(f_theta - mu f_phi)``
recomputed from the rollout policy's checkpoint and the memory (as OpenRLHF's DLC: bfloat16 engines give a few
1e-2, float32 ones ~1e-5)."""
CHECK_TIMEOUT_S = 1800.0
FIELDS = ("prompts", "responses", "response_mask", "rollout_log_probs")

_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_UTILS = "verl.workers.rollout.vllm_rollout.utils"
_BASE = "verl.trainer.ppo.v1.trainer_base"
_REPLAY = "verl.trainer.ppo.v1.replay_buffer"
# engine_kwargs.vllm is laid over verl's own arguments (worker_extension_cls, hf_overrides) last
LAUNCH = Target(_SERVER, "vLLMHttpServer.launch_server", uses="**engine_kwargs")
COLLECTIVE_RPC = Target(_SERVER, "vLLMHttpServer.collective_rpc",
                        params=("self", "method", "timeout", "args", "kwargs"))  # fmt: skip
EXTENSION = Target(_UTILS, "vLLMColocateWorkerExtension")
# verl's MoE weight-loader patch, called on the engine's model (monkey_patch_model, update_weights_from_ipc), wants a
# model.model or model.language_model; the composite has policy and memory stacks: it is given each of them
MOE_PATCH = Target(_UTILS, "patch_vllm_moe_model_weight_loader")
UPDATE_FROM_IPC = Target(_UTILS, "vLLMColocateWorkerExtension.update_weights_from_ipc",
                         params=("self", "peft_config", "base_sync_done", "use_shm"))  # fmt: skip
CLEAR_GROUPS = Target(_REPLAY, "ReplayBuffer._clear_groups", params=("self", "partition_id", "uids"))
STEP = Target(_BASE, "PPOTrainer.step", params=("self", "metrics", "timing_raw"))
SAVE = Target(_BASE, "PPOTrainer._save_checkpoint", params=("self",))
LOAD = Target(_BASE, "PPOTrainer._load_checkpoint", uses="self.global_steps = int(global_step_folder.split(")
SYNC = Target("verl.trainer.ppo.v1.trainer_sync", "PPOTrainerSync.on_step_end",
              uses="self.checkpoint_manager.update_weights(self.global_steps)")  # fmt: skip
TARGETS = (LAUNCH, COLLECTIVE_RPC, EXTENSION, MOE_PATCH, UPDATE_FROM_IPC, CLEAR_GROUPS, STEP, SAVE, LOAD, SYNC)


class VerlTargetMissing(PatchTargetMissing):
    """The installed verl lacks a symbol DLC relies on, or has it in another shape than verl 0.9.1's."""


class DivergenceCheckFailed(RuntimeError):
    """The engines do not sample from the DLC composite the run trains."""


class MemoryNotInEngines(RuntimeError):
    """A vLLM worker did not load the memory's current weights after verl's sync."""


def check(targets=TARGETS) -> None:
    """Find every verl symbol DLC relies on in the installed verl's source (nothing imported)."""
    for target in targets:
        try:
            target.check()
        except PatchTargetMissing as exc:
            raise VerlTargetMissing(
                f"{target}: {exc.args[0].split(': calibrl patches')[0].split(str(target))[-1].strip()}; calibrl's DLC "
                f"for verl wraps verl {VERL_PINNED} (pip install verl=={VERL_PINNED}); installed: {_version('verl')}"
            ) from None


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class Settings:
    """What DLC needs of a run. ``ranks``: memory ranks, one per GPU of the run (colocated); ``exchange_dir``: where
    the memory's weights go to the engines (None: ``{default_local_dir}/dlc_exchange``; must be readable by every
    vLLM worker: node-local /dev/shm on one node, a shared file system across nodes); ``check_every``: also check at
    every step whose rollout policy verl saved (``hf_model`` in the actor's save_contents), not only at step 1."""

    memory_path: str
    mu: float
    lr: float
    weight_decay: float
    decay_scope: str
    max_tokens: int
    ranks: int = 1
    compute_dtype: str = "bfloat16"
    export_dtype: str | None = None  # None: the rollout's dtype
    exchange_dir: str | None = None
    check_every: bool = True
    tolerance: float = CHECK_TOLERANCE

    def __post_init__(self):
        if not self.mu > 0 or not self.lr > 0:
            raise ValueError(f"DLC needs mu > 0 and a memory learning rate > 0, got {self.mu}, {self.lr}")
        if not self.memory_path:
            raise ValueError("DLC needs the memory's checkpoint (memory_path)")

    @classmethod
    def from_stamp(cls, stamp) -> Settings:
        """A run's settings (``calibrl.checkpoints.RunStamp``): the method's mu and memory lr, the memory's folder,
        the training's weight decay, the layout's tokens per GPU and GPUs."""
        lay, train, method = stamp.resources, stamp.train, stamp.method
        cpu = bool(lay.get("cpu_rehearsal"))
        return cls(
            memory_path=str(stamp.paths["memory"]),
            mu=float(method.dlc_mu),
            lr=float(method.memory_lr),
            weight_decay=float(train["weight_decay"]),
            decay_scope=str(train["weight_decay_scope"]),
            max_tokens=int(lay["max_tokens_per_gpu"]),
            ranks=int(lay["nodes"]) * int(lay["gpus_per_node"]),
            compute_dtype="float32" if cpu else "bfloat16",
        )


def _mu_of(spec) -> float:
    mu = float(getattr(spec, "dlc_mu", spec))
    if not mu > 0:
        raise ValueError(f"DLC's engines need mu > 0, got {mu}")
    return mu


def engine_overrides(spec, memory_path: str) -> list[str]:
    """``main_ppo`` Hydra overrides that make verl's rollout replicas the DLC composite at the method's mu (``spec``:
    a ``MethodSpec`` or mu itself) with ``memory_path`` as the memory's initial weights, and the sampled tokens'
    logprobs returned (the divergence check). ``hf_overrides`` goes as a JSON string, which verl passes to
    ``vllm serve --hf_overrides`` unchanged."""
    mu = _mu_of(spec)
    if "'" in str(memory_path):
        raise ValueError(f"DLC memory path {memory_path!r}: a quote cannot go through Hydra's quoted string")
    hf = json.dumps({"architectures": [ARCH], "dlc_memory_path": str(memory_path), "dlc_mu": mu})
    vllm = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    return [
        f"+{vllm}.hf_overrides='{hf}'",
        f"+{vllm}.worker_extension_cls={__name__}.DLCWorkerExtension",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.logprobs_mode=processed_logprobs",
    ]


def _engine_settings(config) -> tuple[str, float]:
    """(memory path, mu) the rollout config gives the engines; fails unless it selects the composite."""
    kwargs = config.actor_rollout_ref.rollout.get("engine_kwargs", {}).get("vllm", {}) or {}
    hf = kwargs.get("hf_overrides")
    if isinstance(hf, str):
        hf = json.loads(hf)
    ext = kwargs.get("worker_extension_cls")
    if not hf or list(hf.get("architectures", [])) != [ARCH] or ext != f"{__name__}.DLCWorkerExtension":
        raise RuntimeError(
            f"DLC: the rollout's engine_kwargs.vllm ({dict(kwargs)}) do not select the composite {ARCH} with "
            f"{__name__}.DLCWorkerExtension: add {__name__}.engine_overrides(...) to main_ppo's overrides"
        )
    return str(hf["dlc_memory_path"]), float(hf["dlc_mu"])


# ------------------------------------------------------------------------------------ the vLLM worker side
def _per_stack(original):
    def patch_vllm_moe_model_weight_loader(model):
        if type(model).__name__ == ARCH:
            for stack in (model.policy, model.memory):
                original(stack)
            return None
        return original(model)

    return patch_vllm_moe_model_weight_loader


def _make_worker_extension():
    import importlib

    import torch
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    utils = importlib.import_module(_UTILS)
    UPDATE_FROM_IPC.resolve(utils)
    MOE_PATCH.wrap(utils, TAG, _per_stack)

    class DLCWorkerExtension(vLLMColocateWorkerExtension):
        """verl's worker extension; the memory's weights (re)loaded after every policy sync, from the file the
        trainer names (:meth:`dlc_memory`)."""

        def dlc_memory(self, path: str, mu: float, load: bool = False) -> None:
            """Name the memory's weights file (``memory.*`` names); load it now if ``load`` (the engine is awake),
            else after the next policy sync (it may sleep until then)."""
            model = self.model_runner.model
            if type(model).__name__ != ARCH:
                raise RuntimeError(f"DLC: the engine runs {type(model).__name__}, not {ARCH} (hf_overrides missing)")
            if abs(float(model.mu) - float(mu)) > 1e-12:
                raise RuntimeError(f"DLC: the engine's mu is {model.mu}, the trainer's {mu}")
            self._dlc_path = str(path)
            if load:
                self._dlc_load()

        def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
            out = super().update_weights_from_ipc(peft_config=peft_config, base_sync_done=base_sync_done,
                                                  use_shm=use_shm)  # fmt: skip
            if getattr(self, "_dlc_path", None):  # a level-2 sleep discarded the memory too: restore it
                self._dlc_load()
            return out

        def _dlc_load(self) -> None:
            from safetensors.torch import load_file

            path = self._dlc_path
            weights = load_file(path)
            bad = [n for n in weights if not n.startswith("memory.")]
            if bad:
                raise RuntimeError(f"DLC: {path} holds names outside memory.*: {bad[:3]}")
            model = self.model_runner.model
            loaded = model.load_weights(list(weights.items()))
            with torch.no_grad():
                engine_sum = float(sum(p.detach().float().sum() for n, p in model.memory.named_parameters()))
            status = {
                "file": path,
                "tensors": len(weights),
                "loaded": len(loaded),
                "engine_sum": engine_sum,
                "file_sum": float(sum(t.float().sum() for t in weights.values())),
                "time": time.time(),
            }
            rank = f"{os.environ.get('VERL_REPLICA_RANK', '0')}-{self.local_rank}"
            target = Path(path).parent / f"loaded-{rank}.json"
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(status))
            os.replace(tmp, target)
            log.info("DLC memory loaded into the engine: %s", status)

    DLCWorkerExtension.__module__ = __name__
    DLCWorkerExtension.__qualname__ = "DLCWorkerExtension"
    return DLCWorkerExtension


def _make_memory_worker():
    import torch

    from calibrl.gpu.memory_actor import MemoryWorker

    class VerlMemoryWorker(MemoryWorker):
        """A memory rank that also writes the memory's full weights for the engines (:meth:`export`)."""

        def export(self, path: str, dtype: str) -> dict:
            """Every weight as ``memory.<name>`` in ``dtype`` into ``path`` (rank 0, atomically); collective."""
            from safetensors.torch import save_file

            weights = self.full_weights()
            if self.rank:
                return {}
            cast = getattr(torch, dtype)
            tensors = {n: t.to(cast).contiguous().clone() for n, t in weights}  # tied weights: separate storages
            tmp = f"{path}.tmp"
            save_file(tensors, tmp)
            os.replace(tmp, path)
            return {"tensors": len(tensors), "file_sum": float(sum(t.float().sum() for t in tensors.values()))}

    VerlMemoryWorker.__module__ = __name__
    VerlMemoryWorker.__qualname__ = "VerlMemoryWorker"
    return VerlMemoryWorker


_LAZY = {"DLCWorkerExtension": _make_worker_extension, "VerlMemoryWorker": _make_memory_worker}
_made: dict[str, type] = {}


def __getattr__(name: str):
    # vLLM resolves worker_extension_cls by name in its worker; Ray pickles the memory worker class by reference.
    if name in _LAZY:
        if name not in _made:
            _made[name] = _LAZY[name]()
        return _made[name]
    raise AttributeError(name)


# ------------------------------------------------------------------------------- dropped groups (DAPO)
def _record_cleared(module) -> None:
    """Wrap ``ReplayBuffer._clear_groups``: the trajectories of groups the sync sampler drops (DAPO's filter, its
    surplus) are read before TransferQueue forgets them, for the memory (it learns from every sampled response)."""

    def make(original):
        def _clear_groups(self, partition_id, uids):
            if partition_id == "train" and uids:
                keys = [k for k in self.partitions[partition_id] if k.split("_")[0] in uids]
                if keys:
                    self.__dict__.setdefault("_calibrl_dlc_dropped", []).extend(_trajectories(keys, partition_id))
            return original(self, partition_id, uids)

        return _clear_groups

    CLEAR_GROUPS.wrap(module, TAG, make)


def _rows(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return list(value.unbind())
        return list(value)
    return [torch.as_tensor(v) for v in value]


def _trajectories(keys: list[str], partition_id: str) -> list[tuple]:
    """(sequence, learn mask, sampling logprobs or None) of each trajectory ``keys`` names in TransferQueue."""
    import torch
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=list(keys), partition_id=partition_id, select_fields=list(FIELDS))
    prompts, responses, masks = (_rows(data[f]) for f in FIELDS[:3])
    logprobs = _rows(data["rollout_log_probs"]) if "rollout_log_probs" in data.keys() else [None] * len(prompts)
    out = []
    for p, r, m, lp in zip(prompts, responses, masks, logprobs, strict=True):
        p, r, m = p.long().flatten(), r.long().flatten(), m.flatten()
        if len(m) != len(r):
            raise RuntimeError(f"DLC: a trajectory has {len(r)} response tokens and a mask of {len(m)}")
        seq = torch.cat([p, r])
        learn = torch.cat([torch.zeros(len(p), dtype=torch.bool), m.bool()])
        if lp is not None:
            lp = torch.cat([torch.zeros(len(p)), lp.float().flatten()[: len(r)]])
        out.append((seq, learn, lp))
    return out


def install_trainer_side() -> None:
    """The trainer process's wraps (:func:`_record_cleared`), applied once verl's replay buffer is imported."""
    from calibrl.gpu.patching import when_imported

    check((CLEAR_GROUPS,))
    when_imported(_REPLAY, _record_cleared)


# ------------------------------------------------------------------------------------------- the trainer
class DLC:
    """The memory network beside a verl trainer (a ``PPOTrainerSync`` subclass). The trainer calls, in order:

    * ``start(global_steps, default_local_dir)`` once verl's init is done (``init``: after ``_setup``, where verl
      resumed the actor, and ``on_init_end``, where it synced the engines);
    * ``after_step(batch, metrics)`` at the end of ``step`` (the returned ``KVBatchMeta``; before verl's save);
    * ``save(step, default_local_dir)`` when verl saves step ``step`` (``_save_checkpoint``);
    * ``after_sync(step)`` after ``on_step_end`` (verl's weight sync, where the engines loaded the memory).
    """

    def __init__(self, trainer, settings):
        check()
        self.trainer = trainer
        self.settings = settings if isinstance(settings, Settings) else Settings.from_stamp(settings)
        config = trainer.config
        path, mu = _engine_settings(config)
        if abs(mu - self.settings.mu) > 1e-12:
            raise RuntimeError(f"DLC: the engines sample at mu {mu}, the run's mu is {self.settings.mu}")
        rollout = config.actor_rollout_ref.rollout
        if not rollout.get("calculate_log_probs", False):
            raise RuntimeError("DLC: actor_rollout_ref.rollout.calculate_log_probs must be True (divergence check)")
        if int(rollout.data_parallel_size or 1) != 1:  # verl's config has it (default 1)
            raise RuntimeError("DLC: rollout.data_parallel_size must be 1 (collective_rpc reaches one DP shard)")
        corr = config.algorithm.get("rollout_correction", None)
        if corr is not None and corr.get("bypass_mode", False):
            raise RuntimeError("DLC: algorithm.rollout_correction.bypass_mode would take the composite's logprobs as "
                               "pi_theta_old; DLC's PPO ratio is against the policy alone")  # fmt: skip
        self.model_path = str(config.actor_rollout_ref.model.path)
        self.export_dtype = self.settings.export_dtype or _dtype_name(rollout.dtype)
        self.group = None
        self.first_step = None  # the first step this process trains (1, or k + 1 after a resume from k)
        self.exchange = None
        self.current = None
        self.pending = None

    # ------------------------------------------------------------------ start / resume
    def start(self, global_steps: int, ckpt_dir: str) -> None:
        from calibrl.gpu.memory_group import COLOCATED_SHARE, MemoryGroup

        s = self.settings
        self.exchange = Path(s.exchange_dir or Path(ckpt_dir) / EXCHANGE)
        self.exchange.mkdir(parents=True, exist_ok=True)
        for old in self.exchange.glob("loaded-*.json"):
            old.unlink()
        pg = self._placement()
        self.group = MemoryGroup(s.memory_path, s.lr, s.ranks, pg, COLOCATED_SHARE,
                                 worker=__getattr__("VerlMemoryWorker"), max_tokens=s.max_tokens,
                                 weight_decay=s.weight_decay, decay_scope=s.decay_scope,
                                 compute_dtype=s.compute_dtype)  # fmt: skip
        if global_steps:
            self.resume(global_steps, ckpt_dir)
        self.first_step = int(global_steps) + 1
        self._export(int(global_steps))
        self._point(load=True)  # verl synced the engines in on_init_end: they are awake
        self.after_sync(int(global_steps))
        log.info("DLC memory started (%d ranks, step %d)", s.ranks, global_steps)

    def _placement(self):
        """The placement group of verl's actor pool: one bundle (GPU) per memory rank, beside the actor and vLLM."""
        from verl.trainer.ppo.utils import Role

        mgr = self.trainer.resource_pool_manager
        roles = self.trainer.role_worker_mapping
        role = next(r for r in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor) if r in roles)
        pgs = mgr.get_resource_pool(role).get_placement_groups()
        if len(pgs) != 1 or len(pgs[0].bundle_specs) != self.settings.ranks:
            raise RuntimeError(f"DLC: the memory takes a rank in each of the actor's bundles; verl's pool has "
                               f"{[len(p.bundle_specs) for p in pgs]} bundles per node, the memory "
                               f"{self.settings.ranks} "
                               "ranks (one placement group only: multi-node colocation is not done)")  # fmt: skip
        return pgs[0]

    def resume(self, step: int, ckpt_dir: str) -> int:
        from calibrl.gpu.memory_group import first

        state = Path(ckpt_dir) / f"global_step_{int(step)}" / MEMORY
        if not state.is_dir():
            raise RuntimeError(f"DLC: verl resumes at step {step} but {state} is missing; the memory would restart "
                               "from its initial weights")  # fmt: skip
        steps = first(self.group.load(str(state)))
        if steps != int(step):
            raise RuntimeError(f"DLC: {state} holds {steps} memory steps, the policy {step}")
        log.info("DLC memory resumed from %s (%d steps)", state, steps)
        return steps

    # ------------------------------------------------------------------ each step
    def after_step(self, batch, metrics: dict) -> None:
        import ray

        from calibrl.gpu.memory_group import first

        step = int(self.trainer.global_steps)
        triples = _trajectories(batch.keys, batch.partition_id)
        dropped = self.trainer.replay_buffer.__dict__.pop("_calibrl_dlc_dropped", [])
        everything = triples + dropped
        metrics["dlc/memory_samples"] = float(len(everything))
        metrics["dlc/memory_dropped_samples"] = float(len(dropped))
        policy = self._rollout_policy(step)
        checked = [t for t in triples if t[2] is not None][:CHECK_SEQUENCES]
        if policy is not None and checked:
            refs = self.group.check(policy, self.settings.mu, *zip(*checked))
            done, waiting = ray.wait(refs, num_returns=len(refs), timeout=CHECK_TIMEOUT_S)
            if waiting:
                raise RuntimeError(f"DLC divergence check at step {step} did not finish in {CHECK_TIMEOUT_S:g} s")
            metrics.update(self._checked(ray.get(refs)[0], step))
        metrics["dlc/memory_loss"] = float(first(self.group.step([t[0] for t in everything],
                                                                 [t[1] for t in everything])))  # fmt: skip
        self._export(step)
        self._point(load=False)  # loaded by every worker after verl's sync of the policy (on_step_end)

    def _rollout_policy(self, step: int) -> str | None:
        """The policy checkpoint the engines sampled step ``step`` with, where it is on disk."""
        if step == self.first_step == 1:
            return self.model_path
        if not self.settings.check_every and step != self.first_step:
            return None
        from calibrl.backends.verl.hf_copies import hf_target

        ckpt = Path(self.trainer.config.trainer.default_local_dir)
        # verl's copy beside its state, or where the trainer moved an evaluated step's (trainer.keep_hf)
        for hf in (ckpt / f"global_step_{step - 1}" / "actor" / "huggingface", hf_target(ckpt, step - 1)):
            if glob.glob(str(hf / "*.safetensors")):
                return str(hf)
        return None

    def _checked(self, stats: dict, step: int) -> dict:
        out = {f"dlc/{k}": float(v) for k, v in stats.items()}
        mean, most = out["dlc/check_mean_abs"], out["dlc/check_max_abs"]
        log.info("DLC divergence check at step %d: mean |dlogp| %.4g, max %.4g", step, mean, most)
        if not mean <= self.settings.tolerance:
            raise DivergenceCheckFailed(
                f"DLC at step {step}: the engines' sampling logprobs differ from log_softmax(f_theta - mu f_phi) by "
                f"{mean:.4g} per token on average (max {most:.4g}), over the tolerance {self.settings.tolerance}: "
                "the engines sample from another distribution than the one trained (memory weights not in them, "
                "another mu, another policy)"
            )
        return out

    def _export(self, step: int) -> None:
        from calibrl.gpu.memory_group import first

        path = self.exchange / f"memory-{int(step)}.safetensors"
        info = first(self.group.each("export", str(path), self.export_dtype))
        self.pending = {"file": str(path), **info}

    def _point(self, load: bool) -> None:
        """Name the pending file to every replica's workers (verl's ``vLLMHttpServer.collective_rpc``)."""
        import ray

        servers = [r.servers[0] for r in self.trainer.llm_server_manager.get_replicas()]
        ray.get([s.collective_rpc.remote("dlc_memory", args=(self.pending["file"], self.settings.mu, load))
                 for s in servers])  # fmt: skip
        self.servers = len(servers)

    def after_sync(self, step: int) -> None:
        """Every worker loaded the current memory file (their ``loaded-*.json``); the previous files go."""
        want = self.pending
        workers = self.servers * int(self.trainer.config.actor_rollout_ref.rollout.tensor_model_parallel_size)
        statuses = [json.loads(p.read_text()) for p in sorted(self.exchange.glob("loaded-*.json"))]
        ok = [s for s in statuses if s["file"] == want["file"]]
        if len(ok) != workers or any(s["tensors"] != want["tensors"] for s in ok):
            raise MemoryNotInEngines(f"DLC after step {step}: {len(ok)} of {workers} vLLM workers loaded {want['file']}"
                                     f" ({statuses})")  # fmt: skip
        self.current = want
        for old in self.exchange.glob("memory-*.safetensors"):
            if str(old) != want["file"]:
                old.unlink()

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int, ckpt_dir: str) -> str:
        import ray

        path = Path(ckpt_dir) / f"global_step_{int(step)}" / MEMORY
        ray.get(self.group.save(str(path)))
        return str(path)

    def close(self) -> None:
        if self.group is not None:
            self.group.kill()
            self.group = None


def _dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}.get(
        name, name
    )


__all__ = ["DLC", "Settings", "engine_overrides", "install_trainer_side", "check"]
