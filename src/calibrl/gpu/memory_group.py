"""DLC's memory trainer as a group of Ray actors, one ``memory_actor.MemoryWorker`` rank per GPU (or a backend's
subclass of it, which adds how the weights reach its engines: ``each`` calls its methods on every rank).

Where the ranks go is the layout's choice (``layout``, ``docs/cluster.md`` "DLC"):

* colocated (``colocate_all``, config/paper.yaml): one rank in each bundle of the trainer's shared placement group,
  beside the roles of that GPU (the memory takes ``COLOCATED_SHARE``: OpenRLHF's actor, reference and vLLM
  worker take 0.2 each). The memory's step follows the policy's: both are compute-bound on the same GPUs.
* split: ``memory_gpus`` GPUs of its own in a placement group of its own; the memory's step starts with the
  policy's (the same rollout) and runs beside it.

Every call goes to all ranks (FSDP's collectives); the step's responses are dealt to the ranks by tokens
(``packing.split``). The group returns Ray object refs, so a caller can overlap the step with other work.
"""

from __future__ import annotations

import torch

from calibrl.gpu.memory_actor import MemoryWorker
from calibrl.gpu.packing import split

COLOCATED_SHARE = 0.2  # of a GPU and a CPU per bundle: as each of OpenRLHF's roles (cli/train_ppo_ray.py)


class MemoryGroup:
    def __init__(self, path: str, lr: float, ranks: int, placement=None, share: float = 1.0, *,
                 worker: type = MemoryWorker, **kwargs):  # fmt: skip
        """``ranks`` workers of class ``worker`` (``kwargs``: its own); ``placement``: a Ray placement group with a
        bundle per rank (or None: anywhere); ``share``: the GPU (and CPU) fraction each rank asks for where Ray has
        GPUs."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = share if ray.cluster_resources().get("GPU", 0) >= 1 else 0

        def options(rank: int) -> dict:
            opts = {"num_gpus": gpus, "num_cpus": share}
            if placement is not None:
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group=placement, placement_group_bundle_index=rank
                )
            return opts

        remote = ray.remote(worker)
        self.workers = [remote.options(**options(r)).remote(path, lr, start=False, **kwargs) for r in range(ranks)]
        address, port = ray.get(self.workers[0].address.remote())
        ray.get([w.start.remote(r, ranks, address, port) for r, w in enumerate(self.workers)])

    def each(self, method: str, *args, **kwargs) -> list:
        """Refs of ``method`` called on every rank (collective)."""
        return [getattr(w, method).remote(*args, **kwargs) for w in self.workers]

    def step(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> list:
        """Refs of one memory step (Algorithm 1 line 22); each rank's ref holds the step's loss."""
        parts = split(sequences, learn, len(self.workers))
        return [w.step.remote(s, m) for w, (s, m) in zip(self.workers, parts)]

    def loss(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> list:
        parts = split(sequences, learn, len(self.workers))
        return [w.loss.remote(s, m) for w, (s, m) in zip(self.workers, parts)]

    def check(self, policy_path: str, mu: float, sequences, learn, sample_logprobs) -> list:
        """Refs of the divergence check; rank 0's holds the statistics."""
        return self.each("check", policy_path, mu, sequences, learn, sample_logprobs)

    def full_weights(self) -> list:
        return self.each("full_weights")

    def save(self, directory: str) -> list:
        return self.each("save", directory)

    def load(self, directory: str) -> list:
        return self.each("load", directory)

    def kill(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


def first(refs: list):
    """Rank 0's result of a group call (waiting for every rank)."""
    import ray

    return ray.get(refs)[0]
