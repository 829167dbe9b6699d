"""DLC's memory network m_phi at paper scale: its trainer, run as a Ray actor (Algorithm 1 lines 21-22).

After every step, m_phi takes one cross-entropy step (``calibrl.algo.dlc.memory_loss``, the loss the CPU trainer
uses) on the responses sampled since its previous step: all of them, including the groups DAPO's dynamic
filter drops, since they were sampled too and the memory tracks sampling frequencies (Section 3.2). It has
its own optimizer (AdamW, ``memory_lr``), and its state (weights, optimizer, step) is saved beside the
policy's checkpoints and resumed from there.

``MemoryTrainer`` is plain Python (tested on CPU as a real Ray actor, ``actor()``); ``dlc`` hooks it
into OpenRLHF. How its weights reach the engines:

* on GPUs (``broadcast``), the channel OpenRLHF uses for the policy: a process group between this actor
  (rank 0) and every vLLM worker, made through the engines' own ``init_process_group`` under a group name of
  ours, which ``DLCWorkerWrap`` (``dlc``) keeps apart from the policy's; then, per parameter,
  ``engine.update_weight("memory." + name, ...)`` on every engine and a broadcast from here, which lands in
  the composite model's ``load_weights`` (``vllm_dlc``);
* on CPU (the tests), ``named_weights()`` gives the same ``memory.*`` names, pushed with ``vllm_dlc.push``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from calibrl.algo.dlc import memory_loss

log = logging.getLogger("calibrl.memory_actor")
STATE = "memory_state.pt"
WEIGHTS = "memory_hf"
# Response tokens per logits chunk. Qwen3's vocabulary is 151,936: a micro-batch of 8 responses of 8k tokens
# would hold 8 x 8,192 x 151,936 float32 logits (~40 GB) at once; chunks of 4,096 rows hold 2.5 GB, and the
# backward pass recomputes each chunk's logits from its hidden states instead of keeping them.
LOGIT_CHUNK = 4096
# The divergence check reads each checked sequence's first tokens only (a prefix's logprobs do not depend on
# what follows), one sequence at a time: 2,048 x 151,936 float32 logits per model, not a batch of 8k responses.
CHECK_TOKENS = 2048


def pad_batch(sequences: list[torch.Tensor], learn: list[torch.Tensor], pad_id: int):
    """Right-pad 1-D token tensors into (B, L) ids, attention mask and learn mask (token t is a target)."""
    if len(sequences) != len(learn) or not sequences:
        raise ValueError(f"{len(sequences)} sequences and {len(learn)} masks: need the same, non-zero number")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.bool)
    target = torch.zeros((len(sequences), width), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(sequences, learn)):
        if len(s) != len(m):
            raise ValueError(f"sequence {i}: {len(s)} tokens but a mask of {len(m)}")
        ids[i, : len(s)], attention[i, : len(s)], target[i, : len(s)] = s, True, m.bool()
    return ids, attention, target


class MemoryTrainer:
    """m_phi with its optimizer; ``step`` is Algorithm 1 line 22. One instance per run."""

    def __init__(self, path: str, lr: float, dtype: str = "float32", device: str | None = None, micro_batch: int = 8):
        from transformers import AutoModelForCausalLM

        if not lr > 0:
            raise ValueError(f"memory_lr must be > 0, got {lr}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(self.device)
        if self.device.type == "cuda":
            self.model.gradient_checkpointing_enable()  # 8k-token responses: activations, not weights, dominate
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self.micro_batch = int(micro_batch)
        self.steps = 0
        self._group = None

    def loss(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> float:
        """The memory's mean cross-entropy on the ``learn`` tokens, without a step (for logging and tests)."""
        with torch.no_grad():
            return self._loss(sequences, learn, backward=False)

    def _loss(self, sequences, learn, backward: bool) -> float:
        total = sum(int(m[1:].sum()) for m in learn)  # token 0 has no prediction
        if total == 0:
            raise ValueError("the memory step got no response tokens")
        value = 0.0
        for start in range(0, len(sequences), self.micro_batch):
            ids, attention, target = pad_batch(
                sequences[start : start + self.micro_batch], learn[start : start + self.micro_batch], self.pad_id
            )
            ids, attention, target = ids.to(self.device), attention.to(self.device), target.to(self.device)
            if not target[:, 1:].any():
                continue
            hidden = self.model.base_model(input_ids=ids, attention_mask=attention.long()).last_hidden_state
            rows = target[:, 1:]  # the positions whose next token is a response token
            part = self._loss_sum(hidden[:, :-1][rows], ids[:, 1:][rows]) / total  # token mean over the step
            if backward:
                part.backward()
            value += float(part.detach())
        return value

    def _loss_sum(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed ``memory_loss`` of the next tokens ``labels`` (n,) from their hidden states (n, H), with the
        logits made ``LOGIT_CHUNK`` rows at a time (checkpointed: recomputed in backward, never kept)."""
        from torch.utils.checkpoint import checkpoint

        head = self.model.get_output_embeddings()

        def piece(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return memory_loss(head(h).float(), y, reduction="sum")

        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, len(labels), LOGIT_CHUNK):
            h, y = hidden[start : start + LOGIT_CHUNK], labels[start : start + LOGIT_CHUNK]
            total = total + (checkpoint(piece, h, y, use_reentrant=False) if torch.is_grad_enabled() else piece(h, y))
        return total

    def step(self, sequences: list[torch.Tensor], learn: list[torch.Tensor]) -> float:
        """One AdamW step of cross-entropy on the sampled responses; returns the loss before the step."""
        self.optimizer.zero_grad(set_to_none=True)
        value = self._loss(sequences, learn, backward=True)
        self.optimizer.step()
        self.steps += 1
        return value

    def check(self, policy_path: str, mu: float, sequences, learn, sample_logprobs) -> dict:
        """The divergence check (``vllm_dlc.divergence``): the engine's sampling logprobs against
        ``log_softmax(f_theta - mu f_phi)`` recomputed with the policy checkpoint the engine sampled with and
        this memory as it was at sampling time (call before ``step``)."""
        from transformers import AutoModelForCausalLM

        from calibrl.backends.openrlhf.vllm_dlc import composite_logprobs, divergence

        if getattr(self, "_policy_path", None) != policy_path:
            # bfloat16 on GPUs, as the engines hold it (an 8B policy beside the float32 memory and its optimizer)
            dtype = torch.bfloat16 if self.device.type == "cuda" else next(self.model.parameters()).dtype
            self._policy = AutoModelForCausalLM.from_pretrained(policy_path, dtype=dtype).to(self.device).eval()
            self._policy_path = policy_path
        cut = slice(0, CHECK_TOKENS)
        ids, _, target = pad_batch([s[cut] for s in sequences], [m[cut] for m in learn], self.pad_id)
        sample = torch.zeros(ids.shape)
        recomputed = torch.zeros(ids.shape)
        for i, lp in enumerate(sample_logprobs):
            sample[i, : len(lp[cut])] = lp[cut]
        self.model.eval()
        try:
            with torch.no_grad():
                for i in range(len(ids)):
                    row, mask = ids[i : i + 1].to(self.device), target[i : i + 1].to(self.device)
                    recomputed[i : i + 1] = composite_logprobs(self._policy, self.model, mu, row, mask).cpu()
        finally:
            self.model.train()
        return divergence(sample, recomputed, target)

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """``memory.<name>`` and the tensor (CPU) of every parameter: what the composite model loads."""
        return [(f"memory.{n}", p.detach().cpu()) for n, p in self.model.named_parameters()]

    # ------------------------------------------------------------------------------ checkpoints
    def save(self, directory: str) -> str:
        """Weights (Hugging Face), optimizer and step count into ``directory``, replaced atomically."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
        try:
            self.model.save_pretrained(tmp / WEIGHTS)
            torch.save({"optimizer": self.optimizer.state_dict(), "steps": self.steps}, tmp / STATE)
            old = None
            if directory.exists():  # moved aside, deleted once the new one is in place
                old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".old", dir=directory.parent))
                os.replace(directory, old / directory.name)
            os.replace(tmp, directory)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return str(directory)

    def load(self, directory: str) -> int:
        """Resume from ``save``'s directory; returns the step count."""
        from safetensors.torch import load_file

        directory = Path(directory)
        state = torch.load(directory / STATE, map_location=self.device, weights_only=False)
        weights = {}
        for file in sorted((directory / WEIGHTS).glob("*.safetensors")):
            weights.update(load_file(file, device=str(self.device)))
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        if unexpected or any("lm_head" not in m for m in missing):  # lm_head may be tied to the embeddings
            raise RuntimeError(f"memory checkpoint {directory}: missing {missing}, unexpected {unexpected}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        return self.steps

    # --------------------------------------------------------------------- GPU weight broadcast
    def init_broadcast(self, engines: list, tensor_parallel_size: int, group_name: str) -> None:
        """Join every vLLM worker in a process group of our own, as OpenRLHF's actor does for the policy."""
        import socket

        import ray
        from openrlhf.utils.distributed_util import stateless_init_process_group

        address = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        world = len(engines) * tensor_parallel_size + 1
        refs = [
            e.init_process_group.remote(address, port, i * tensor_parallel_size + 1, world, group_name, "nccl", False)
            for i, e in enumerate(engines)
        ]
        self._group = stateless_init_process_group(address, port, 0, world, torch.cuda.current_device())
        ray.get(refs)

    def broadcast(self, engines: list) -> None:
        """Send every parameter as ``memory.<name>`` to every engine (NCCL), then reset their prefix caches."""
        import ray

        if self._group is None:
            raise RuntimeError("init_broadcast first")
        params = list(self.model.named_parameters())
        for count, (name, param) in enumerate(params, 1):
            data = param.data.to(torch.bfloat16) if param.dtype != torch.bfloat16 else param.data
            last = count == len(params)
            refs = [
                e.update_weight.remote(f"memory.{name}", dtype=data.dtype, shape=data.shape, empty_cache=last)
                for e in engines
            ]
            self._group.broadcast(data, src=0, stream=torch.cuda.current_stream())
            ray.get(refs)
        ray.get([e.reset_prefix_cache.remote() for e in engines])


def actor(path: str, lr: float, **kwargs):
    """A ``MemoryTrainer`` as a Ray actor (one GPU when Ray has one, else CPU)."""
    import ray

    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    return ray.remote(num_gpus=gpus, num_cpus=1)(MemoryTrainer).remote(path, lr, **kwargs)
