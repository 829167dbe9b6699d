"""DLC's memory network m_phi at paper scale: one data-parallel rank of its trainer (Algorithm 1 lines 21-22).

After every policy step, m_phi takes one cross-entropy step (``calibrl.algo.dlc.memory_loss``, the loss the CPU
trainer uses, token mean over the step) on every response sampled since its previous step, including the groups
DAPO's filter drops: they were sampled too, and the memory tracks sampling frequencies (Section 3.2).

How it keeps up with the policy (``docs/cluster.md``, "DLC"):

* sharded over ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``, each decoder layer a unit), one rank per
  GPU of the run (``memory_group``): Qwen3-1.7B's fp32 weights, gradients and AdamW moments (27.5 GB) become
  3.4 GB per GPU of 8, so the memory lives beside OpenRLHF's colocated roles;
* bf16 compute with fp32 master weights, fp32 gradient reduction and fp32 AdamW state (``MixedPrecisionPolicy``;
  AdamW steps of lr ~1e-6 would vanish in bf16 weights), torch's fused AdamW on GPUs;
* padding-free micro-batches of at most ``max_tokens`` tokens (``packing``), as the policy's ``max_tokens_per_gpu``,
  with gradient checkpointing and the LM head's logits made ``LOGIT_CHUNK`` rows at a time.

The divergence check (``check``) loads the rollout policy only while it runs, on rank 0, and frees it.
Weights leave through ``full_weights`` (every rank joins; rank 0 gets the full tensors); how they reach a
trainer's rollout engines is its backend's (OpenRLHF: ``calibrl.backends.openrlhf.memory_sync``, a subclass).
``MemoryWorker`` is plain Python: the tests run it in-process and as Ray actors on CPU (gloo).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from calibrl.algo.dlc import memory_loss
from calibrl.gpu.packing import pack, pad_batch
from calibrl.optim import decay_groups

log = logging.getLogger("calibrl.memory_actor")
STEPS = "steps.json"
# Response tokens per logits chunk. Qwen3's vocabulary is 151,936: 9,216 tokens of float32 logits are 5.6 GB;
# chunks of 4,096 rows hold 2.5 GB, recomputed in backward from their hidden states instead of kept.
LOGIT_CHUNK = 4096
# The divergence check reads each checked sequence's first tokens only (a prefix's logprobs do not depend on
# what follows), one sequence at a time: 2,048 x 151,936 float32 logits per model, not a batch of 8k responses.
CHECK_TOKENS = 2048


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class _Loss(torch.nn.Module):
    """The FSDP root: the language model's body, then the head's loss in checkpointed chunks. Being the root,
    its forward un-shards the embeddings and the (tied) head, and keeps them for backward (FSDP2 does not
    reshard the root after forward)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        hidden = self.lm.base_model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
        rows = target[:, 1:]
        hidden, labels = hidden[:, :-1][rows], ids[:, 1:][rows]
        head = self.lm.get_output_embeddings()
        if not len(labels):  # a rank with nothing left: the same collectives as the others, a zero loss
            return memory_loss(head(hidden.new_zeros(1, hidden.shape[-1])).float(), ids[0, :1], "sum") * 0.0
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, len(labels), LOGIT_CHUNK):
            h, y = hidden[start : start + LOGIT_CHUNK], labels[start : start + LOGIT_CHUNK]
            if torch.is_grad_enabled():
                total = total + checkpoint(_head_loss, head, h, y, use_reentrant=False)
            else:
                total = total + _head_loss(head, h, y)
        return total


def _head_loss(head, h, y):
    return memory_loss(head(h).float(), y, reduction="sum")


class MemoryWorker:
    """One rank of m_phi's trainer; ``step`` is Algorithm 1 line 22. Every public method but ``init_broadcast``
    is collective: all ranks call it, in the same order."""

    def __init__(
        self,
        path: str,
        lr: float,
        *,
        weight_decay: float,
        decay_scope: str,
        max_tokens: int,
        compute_dtype: str = "bfloat16",
        device: str | None = None,
        start: bool = True,
    ):
        if not lr > 0:
            raise ValueError(f"memory_lr must be > 0, got {lr}")
        if not max_tokens or int(max_tokens) <= 0:  # the run's max_tokens_per_gpu (layout), never a default
            raise ValueError(f"max_tokens (the run's max_tokens_per_gpu) must be > 0, got {max_tokens!r}")
        self.path, self.lr, self.max_tokens = path, float(lr), int(max_tokens)
        self.weight_decay, self.decay_scope = float(weight_decay), str(decay_scope)  # the run's grid.train ones
        self.compute_dtype = getattr(torch, compute_dtype)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._empty_cache = self.device.type == "cuda"  # _release: CUDA's caching allocator only
        self.steps = 0
        if start:  # one rank in this process (a Ray group starts its ranks once rank 0's address is known)
            self.start(0, 1, "127.0.0.1", free_port())

    def start(self, rank: int, world: int, address: str, port: int) -> None:
        """Join the ranks' process group and build the sharded model and its optimizer."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from transformers import AutoModelForCausalLM

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index or 0)
        if not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)
        elif dist.get_world_size() != world:
            raise RuntimeError(f"a process group of {dist.get_world_size()} ranks exists; the memory needs {world}")
        self.rank, self.world = dist.get_rank(), world
        attention = "flash_attention_2" if self.device.type == "cuda" and _has_flash_attn() else "sdpa"
        # float32 master weights; the compute dtype is FSDP's (param_dtype), gradients reduced in float32
        lm = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32, attn_implementation=attention)
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.config.use_cache = False
        policy = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        for layer in lm.base_model.layers:
            fully_shard(layer, mp_policy=policy)
        self.model = _Loss(lm).to(self.device)
        fully_shard(self.model, mp_policy=policy)
        self.model.train()
        groups = decay_groups(self.model, self.weight_decay, self.decay_scope)
        self.optimizer = torch.optim.AdamW(groups, lr=self.lr, fused=self.device.type == "cuda")
        self.pad_id = lm.config.pad_token_id if lm.config.pad_token_id is not None else 0

    def _release(self) -> None:
        """Give the caching allocator's free blocks back to the GPU (CUDA only; a no-op on CPU). The ranks share
        their GPUs with the colocated vLLM engines, which wake up for the next generation and map their weights
        and KV cache again: without this, the activations, logits chunks and gathered weights of a step, check or
        broadcast (several GB per GPU at Qwen3-1.7B and 9,216 tokens) stay reserved by this process's PyTorch,
        unused, while the engine beside it runs short."""
        if self._empty_cache:
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------ the step
    def _reduce(self, value: float, op=dist.ReduceOp.SUM) -> float:
        """``value`` reduced over the ranks (NCCL reduces on the GPU, gloo on the CPU)."""
        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([float(value)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    def _run(self, sequences, learn, backward: bool) -> float:
        """The step's token-mean loss over every rank's responses; gradients accumulated when ``backward``."""
        batches = pack(sequences, learn, self.max_tokens) if sequences else []
        total = self._reduce(sum(b.targets for b in batches))
        if total == 0:
            raise ValueError("the memory step got no response tokens")
        rounds = int(self._reduce(len(batches), dist.ReduceOp.MAX))
        empty = pack([torch.tensor([self.pad_id, self.pad_id])], [torch.tensor([0, 0])], 2)[0]
        value = 0.0
        for i in range(rounds):  # the same number of forward/backward passes on every rank (FSDP's collectives)
            b = batches[i] if i < len(batches) else empty
            part = self.model(b.ids.to(self.device), b.positions.to(self.device), b.target.to(self.device)) / total
            if backward:
                # FSDP averages gradients over ranks; the loss is already a mean over all ranks' tokens
                (part * self.world).backward()
            value += float(part.detach())
        if not backward:  # FSDP keeps the root's weights gathered after a forward, for the backward that follows
            self.model.reshard()
        return self._reduce(value)

    def loss(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> float:
        """The memory's mean cross-entropy on the ``learn`` tokens, without a step (for logging and tests)."""
        with torch.no_grad():
            value = self._run(sequences, learn, backward=False)
        self._release()
        return value

    def gradients(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> float:
        """The step's gradients, without the AdamW update (its per-token work: ``benchmarks/`` times it alone)."""
        value = self._gradients(sequences, learn)
        self._release()
        return value

    def _gradients(self, sequences, learn) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        return self._run(sequences, learn, backward=True)

    def step(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> float:
        """One AdamW step of cross-entropy on this rank's share of the responses (``packing.split``); returns the
        loss over all ranks' responses before the step."""
        value = self._gradients(sequences, learn)
        self.optimizer.step()
        self.steps += 1
        self._release()
        return value

    # ------------------------------------------------------------------------------ weights out
    def full_weights(self) -> list[tuple[str, torch.Tensor]]:
        """``memory.<name>`` and the full tensor (on CPU) of every weight, on rank 0 (others: []); collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        self._release()  # each weight was gathered on the GPU before its copy to CPU
        if self.rank:
            return []
        return [(f"memory.{k[len('lm.') :]}", v) for k, v in state.items()]

    def check(self, policy_path: str, mu: float, sequences, learn, sample_logprobs) -> dict:
        """The divergence check (``vllm_dlc.divergence``): the engine's sampling logprobs against
        ``log_softmax(f_theta - mu f_phi)`` recomputed on rank 0 by the policy checkpoint the engine sampled with
        and this memory as it was at sampling time (call before ``step``). Both models exist only during the
        check: the 8B policy is not held beside the memory between checks. Collective (the memory's gather)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        from calibrl.gpu.vllm_dlc import composite_logprobs, divergence

        weights = self.full_weights()
        if self.rank:
            return {}
        dtype = self.compute_dtype if self.device.type == "cuda" else torch.float32  # the engines' dtype on GPUs
        with torch.device(self.device):
            memory = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.path), dtype=dtype)
        memory.load_state_dict({n[len("memory.") :]: t for n, t in weights}, strict=False)
        memory.tie_weights()
        policy = AutoModelForCausalLM.from_pretrained(policy_path, dtype=dtype).to(self.device)
        try:
            cut = slice(0, CHECK_TOKENS)
            ids, _, target = pad_batch([s[cut] for s in sequences], [m[cut] for m in learn], self.pad_id)
            sample, recomputed = torch.zeros(ids.shape), torch.zeros(ids.shape)
            for i, lp in enumerate(sample_logprobs):
                sample[i, : len(lp[cut])] = lp[cut]
            with torch.no_grad():
                for i in range(len(ids)):
                    row, mask = ids[i : i + 1].to(self.device), target[i : i + 1].to(self.device)
                    recomputed[i : i + 1] = composite_logprobs(policy, memory.eval(), mu, row, mask).float().cpu()
            return divergence(sample, recomputed, target)
        finally:
            del policy, memory
            self._release()

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, directory: str) -> str:
        """Sharded weights and optimizer state (``torch.distributed.checkpoint``) and the step count into
        ``directory``, replaced atomically once every rank has written. Collective."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        directory = Path(directory)
        tmp = directory.parent / f".{directory.name}.tmp"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            (tmp / STEPS).write_text(json.dumps({"steps": self.steps, "world": self.world}))
        dist.barrier()
        model, optim = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model, "optim": optim}, checkpoint_id=str(tmp))
        dist.barrier()
        if self.rank == 0:
            old = directory.parent / f".{directory.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            if directory.exists():
                os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return str(directory)

    def load(self, directory: str) -> int:
        """Resume from ``save``'s directory (any number of ranks: DCP reshards); returns the step count."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        directory = Path(directory)
        if not (directory / STEPS).is_file():
            raise FileNotFoundError(f"memory checkpoint {directory}: no {STEPS} (not written by MemoryWorker.save)")
        model, optim = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optim": optim}
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.steps = int(json.loads((directory / STEPS).read_text())["steps"])
        return self.steps

    # --------------------------------------------------------------------- ranks as Ray actors
    def address(self) -> tuple[str, int]:
        """Where rank 0 of a group listens (``memory_group`` asks it before starting every rank)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()


def _has_flash_attn() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True
