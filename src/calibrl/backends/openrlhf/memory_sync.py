"""How DLC's memory weights reach OpenRLHF's vLLM engines: ``memory_sync.MemoryWorker``, the shared memory trainer
(``calibrl.gpu.memory_actor``) with the engine calls of OpenRLHF's ``LLMRayActor`` (``init_process_group``,
``update_weight``, ``update_weight_cuda_ipc``, ``reset_prefix_cache``), as its policy actor syncs the policy."""

from __future__ import annotations

import torch
import torch.distributed as dist

from calibrl.gpu.memory_actor import MemoryWorker as SharedWorker
from calibrl.gpu.memory_actor import free_port


class MemoryWorker(SharedWorker):
    """The memory's weights into the composite engines (GPUs only; ``memory.*`` names, ``vllm_dlc``'s
    ``load_weights``). Colocated (a memory rank on every engine GPU) by CUDA IPC, as OpenRLHF's actor syncs the
    policy (``PolicyModelActor.broadcast_to_vllm``, ``WorkerWrap.update_weight_cuda_ipc``); otherwise rank 0
    broadcasts over an NCCL group of its own with every vLLM worker (``DLCWorkerWrap`` keeps it apart from the
    policy's)."""

    def init_broadcast(self, engines: list, tensor_parallel_size: int, group_name: str) -> None:
        import ray
        from openrlhf.utils.distributed_util import stateless_init_process_group

        if self.rank:
            return
        address, port = ray.util.get_node_ip_address(), free_port()
        world = len(engines) * tensor_parallel_size + 1
        refs = [
            e.init_process_group.remote(address, port, i * tensor_parallel_size + 1, world, group_name, "nccl", False)
            for i, e in enumerate(engines)
        ]
        self._group = stateless_init_process_group(address, port, 0, world, torch.cuda.current_device())
        ray.get(refs)

    def broadcast(self, engines: list, ipc: bool) -> None:
        """Every weight to every engine in bf16 (the engines' dtype), one parameter at a time; collective."""
        import ray
        from torch.distributed.tensor import DTensor

        params = list(self.model.named_parameters())
        for count, (name, param) in enumerate(params, 1):
            full = param.full_tensor() if isinstance(param, DTensor) else param.data  # all ranks gather
            data = full.to(torch.bfloat16)
            name, last = f"memory.{name[len('lm.') :]}", count == len(params)
            if ipc:
                from openrlhf.trainer.ray.utils import get_physical_gpu_id
                from torch.multiprocessing.reductions import reduce_tensor

                handles = [None] * self.world
                dist.all_gather_object(handles, {get_physical_gpu_id(): reduce_tensor(data)})
                if self.rank == 0:
                    merged = {k: v for h in handles for k, v in h.items()}
                    ray.get([
                        e.update_weight_cuda_ipc.remote(
                            name, dtype=data.dtype, shape=data.shape, ipc_handles=merged, empty_cache=last
                        )
                        for e in engines
                    ])  # fmt: skip
                dist.barrier()
                torch.cuda.synchronize()
            elif self.rank == 0:
                refs = [
                    e.update_weight.remote(name, dtype=data.dtype, shape=data.shape, empty_cache=last) for e in engines
                ]
                self._group.broadcast(data, src=0, stream=torch.cuda.current_stream())
                ray.get(refs)
        if self.rank == 0:
            ray.get([e.reset_prefix_cache.remote() for e in engines])
        self._release()
