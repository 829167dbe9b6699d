"""DLC's composite vLLM model: the policy and the memory as two Qwen3 stacks in one engine (Section 3.2).

Rollouts are drawn from ``softmax(f_theta - mu * f_phi)`` (Algorithm 1 lines 4-6). ``DLCQwen3ForCausalLM``
holds vLLM's own ``Qwen3ForCausalLM`` twice, under the prefixes ``policy`` and ``memory``; ``forward`` runs
both on the same tokens (each stack has its own attention layers, so vLLM gives each its own paged KV cache
from one budget, and batching, prefix caching and CUDA graphs are kept), and ``compute_logits`` returns
``calibrl.algo.dlc.calibrated_logits(f_theta, f_phi, mu)``, the formula the toy and the CPU trainer use. vLLM
applies temperature and top-p after ``compute_logits``, so tokens come from ``softmax((f_theta - mu f_phi)/T)``
and the logprobs it reports (``raw_logprobs``) are ``log_softmax(f_theta - mu f_phi)``.

Selecting it (``engine_kwargs``): the engine's ``model`` is the policy checkpoint, and
``hf_overrides={"architectures": ["DLCQwen3ForCausalLM"], "dlc_memory_path": ..., "dlc_mu": mu}``. The class
is registered in every vLLM process through the package's ``vllm.general_plugins`` entry point (``register``):
the engine's worker is a fresh process, where a registration made in the driver would not exist. The memory's
weights are read from ``dlc_memory_path`` when the policy's are loaded; any two Qwen3 sizes work (they share
the vocabulary, which is checked; widths, depths, heads and head sizes may differ). Both keys are required and
mu must be > 0 (``dlc_settings``): the model fails at start-up rather than default either.

Weight updates. ``load_weights`` routes names that start with ``memory.`` to the memory and all others to
the policy, so OpenRLHF's own policy broadcast (``WorkerWrap.update_weight`` -> ``load_weights``, names as
the Hugging Face actor has them) is unchanged, and the memory actor pushes ``memory.<name>`` through the same
channel (``memory_actor``).

What differs on GPUs (none of it can run here):

* weight sync goes through OpenRLHF's NCCL broadcast (or CUDA IPC when colocated) into ``load_weights``;
  here, on CPU, updates are pushed with ``LLM.apply_model(partial(update, ...))`` (``push``), because
  vLLM-CPU replaces each linear weight by a packed oneDNN handle and empties the parameter after loading.
  On CPU this module therefore keeps the real weights (``_cpu_skip_gemm_dispatch``) and re-packs the
  handles from them after every load (``_repack``); on GPUs nothing of that runs.
* compilation: each stack is compiled under its own config and model tag (``_memory_stack``), so the two get
  separate compile caches; on GPUs vLLM splits each into piecewise CUDA graphs, on CPU it traces each once with
  inductor (``tests/test_vllm_dlc.py`` runs one pair compiled). Weights are copied in place, so captured graphs
  stay valid, as for the policy alone.
* dtype is bfloat16 there (OpenRLHF's engines), float32 in the tests; the divergence check below is how
  a user sees whether the composite samples from what the trainer assumes.

The check a user watches on the first steps: ``divergence(sample_logprobs, recomputed, mask)`` compares
the logprobs the engine reported for sampled tokens with ``log_softmax(f_theta - mu f_phi)`` recomputed by
Hugging Face models (``composite_logprobs``) on a few sequences; the memory actor logs it as
``dlc/check_*`` (mean and max absolute difference, and the k1 KL estimate). Float32 on CPU agrees to ~1e-5;
bfloat16 on GPUs should stay within a few 1e-2 in the mean; a mean of 0.1 or more means the engine samples
from another distribution (stale memory weights, wrong mu, a stack not updated).
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Iterable

import torch

from calibrl.algo.dlc import calibrated_logits

ARCH = "DLCQwen3ForCausalLM"
MEMORY_PREFIX = "memory."
MEMORY_TAG = "dlc_memory"  # the memory stack's compile-cache tag (vLLM's default model tag is "backbone")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: make ``DLCQwen3ForCausalLM`` known to vLLM in this process."""
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, f"{__name__}:DLCQwen3ForCausalLM")


def engine_kwargs(memory_path: str, mu: float) -> dict:
    """The extra ``LLM``/``EngineArgs`` arguments that turn an engine of the policy into the composite."""
    if not memory_path:
        raise ValueError(f"{ARCH}: a memory checkpoint (dlc_memory_path) is needed, got {memory_path!r}")
    return {"hf_overrides": {"architectures": [ARCH], "dlc_memory_path": str(memory_path), "dlc_mu": _mu(mu)}}


def _mu(value, where: str = "engine_kwargs") -> float:
    """mu as a float > 0: the composite exists only for a DLC run (mu = 0 is the policy's own engine)."""
    try:
        mu = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{ARCH}: dlc_mu must be a number > 0 (Section 3.2), got {value!r} ({where})") from None
    if not mu > 0:  # also refuses NaN
        raise ValueError(
            f"{ARCH}: dlc_mu must be > 0 (Section 3.2), got {mu} ({where}); a run without DLC uses the policy's "
            "own engine, not the composite"
        )
    return mu


_MISSING = object()


def dlc_settings(config) -> tuple[str, float]:
    """``(memory_path, mu)`` of the composite, read from the engine's Hugging Face config, where vLLM puts the
    ``hf_overrides`` of :func:`engine_kwargs`. Fails closed: a missing key is an error naming it, never a default
    (a missing ``dlc_mu`` read as 0 would sample from the policy alone while the run reports DLC)."""
    source = "set by hf_overrides from calibrl.gpu.vllm_dlc.engine_kwargs(memory_path, mu)"
    values = {}
    for key in ("dlc_memory_path", "dlc_mu"):
        value = getattr(config, key, _MISSING)
        if value is _MISSING or value is None or value == "":
            raise ValueError(
                f"{ARCH}: the engine's model config has no {key!r}; it must be {source} "
                f"(OpenRLHF: calibrl.backends.openrlhf.dlc.patch_engines), not left to a default"
            )
        values[key] = value
    return str(values["dlc_memory_path"]), _mu(values["dlc_mu"], "the engine's hf_overrides")


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class DLCQwen3ForCausalLM(torch.nn.Module):
    """Policy and memory Qwen3 stacks; logits ``f_theta - mu * f_phi``. Built by vLLM, not by hand."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        from transformers import AutoConfig
        from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
        from vllm.model_executor.models.utils import maybe_prefix

        config = vllm_config.model_config.hf_config
        self.memory_path, self.mu = dlc_settings(config)
        memory_config = AutoConfig.from_pretrained(self.memory_path)
        if memory_config.vocab_size != config.vocab_size:
            raise ValueError(
                f"DLC memory {self.memory_path} has vocab_size {memory_config.vocab_size}, the policy "
                f"{config.vocab_size}: f_theta - mu f_phi needs one vocabulary"
            )
        memory_config.torch_dtype = config.torch_dtype
        self.config = config
        self.policy = Qwen3ForCausalLM(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "policy"))
        self.memory = _memory_stack(vllm_config, memory_config, maybe_prefix(prefix, "memory"))
        self.widths = (config.hidden_size, memory_config.hidden_size)
        self.stacks = "both"  # "policy" / "memory": run one stack only (benchmarks/vllm_dlc_rollout.py)
        self._cpu = _is_cpu()
        self._stale = True  # packed CPU handles must be rebuilt from the weights
        if self._cpu:
            from vllm.model_executor.layers.linear import LinearBase

            for module in self.modules():
                if isinstance(module, LinearBase):
                    module._cpu_skip_gemm_dispatch = True  # keep the weights: they are updated at run time

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.policy.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        if self._cpu and self._stale:
            _repack(self)
        if self.stacks == "both":
            policy = self.policy(input_ids, positions, intermediate_tensors, inputs_embeds)
            memory = self.memory(input_ids, positions)
        elif self.stacks == "policy":
            policy = self.policy(input_ids, positions, intermediate_tensors, inputs_embeds)
            memory = policy.new_zeros(policy.shape[0], self.widths[1])
        else:
            memory = self.memory(input_ids, positions)
            policy = memory.new_zeros(memory.shape[0], self.widths[0])
        # One tensor: vLLM picks the rows it needs (the last token of each request) before compute_logits.
        return torch.cat([policy, memory], dim=-1)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        policy_h, memory_h = hidden_states.split(self.widths, dim=-1)
        if self.stacks == "memory":
            return self.memory.compute_logits(memory_h)
        policy_logits = self.policy.compute_logits(policy_h)
        if self.stacks == "policy":
            return policy_logits
        if self.mu == 0 or policy_logits is None:
            return policy_logits
        memory_logits = self.memory.compute_logits(memory_h)
        return calibrated_logits(policy_logits.float(), memory_logits.float(), self.mu).to(policy_logits.dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Names ``memory.*`` to the memory, the rest to the policy; at start-up the memory from its path."""
        policy, memory = [], []
        for name, tensor in weights:
            if name.startswith(MEMORY_PREFIX):
                memory.append((name[len(MEMORY_PREFIX) :], tensor))
            else:
                policy.append((name, tensor))
        loaded = {f"policy.{n}" for n in self.policy.load_weights(policy)} if policy else set()
        if memory:
            loaded |= {f"memory.{n}" for n in self.memory.load_weights(memory)}
        elif not getattr(self, "_memory_loaded", False):
            loaded |= {f"memory.{n}" for n in self.memory.load_weights(_checkpoint_weights(self.memory_path))}
        self._memory_loaded = True
        self._stale = True
        return loaded


def _memory_stack(vllm_config, memory_config, prefix: str):
    """The memory's ``Qwen3ForCausalLM``, compiled as a model of its own. vLLM's compile wrapper takes the config
    current at construction (``vllm.compilation.wrapper.TorchCompileWithNoGuardsWrapper.__init__``) and the
    compile caches are keyed by that config's hash (AOT artifacts) and by the model tag (piecewise graphs); built
    under the policy's, the memory would load the policy's compiled graphs and fail at start-up profiling on GPUs.
    vLLM separates its draft models the same way (``set_model_tag`` + their own config, ``v1/spec_decode``). The
    ``compilation_config`` object stays the engine's: attention layers register there and the KV cache is sized
    from it."""
    from vllm.compilation.backends import set_model_tag
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

    config = vllm_config.with_hf_config(memory_config, architectures=["Qwen3ForCausalLM"])
    with set_model_tag(MEMORY_TAG), set_current_vllm_config(config):
        return Qwen3ForCausalLM(vllm_config=config, prefix=prefix)


def compile_configs(model: DLCQwen3ForCausalLM) -> dict:
    """Runs inside the engine (``LLM.apply_model``): the hidden size of the config each stack was compiled with,
    and whether each is compiled (a test reads it: the memory must be compiled under its own config)."""
    stacks = {"policy": model.policy.model, "memory": model.memory.model}
    return {
        name: {
            "hidden_size": stack.vllm_config.model_config.hf_config.hidden_size,
            "compiled": not getattr(stack, "do_not_compile", True),
            "hash": stack.vllm_config.compute_hash(),
        }
        for name, stack in stacks.items()
    }


def _checkpoint_weights(path: str) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) of a Hugging Face checkpoint's safetensors files: a directory, or a Hub id (its cache)."""
    from safetensors.torch import load_file

    if not os.path.isdir(path):  # e.g. "Qwen/Qwen3-1.7B" as config/paper.yaml names it; HF_HUB_OFFLINE is honoured
        from huggingface_hub import snapshot_download

        path = snapshot_download(path, allow_patterns=["*.json", "*.safetensors"])
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"DLC memory checkpoint {path} has no *.safetensors files")
    for file in files:
        yield from load_file(file).items()


def _repack(model: DLCQwen3ForCausalLM) -> None:
    """CPU only: rebuild vLLM's packed GEMM handles from the (possibly updated) weights."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
    model._stale = False


# ------------------------------------------------------------------------------ run-time updates (CPU)
def update(model: DLCQwen3ForCausalLM, weights=None, mu=None, stacks: str | None = None) -> int:
    """Runs inside the engine (``LLM.apply_model``): load ``weights`` (routed names), set mu and/or the stacks."""
    if stacks is not None:
        if stacks not in ("both", "policy", "memory"):
            raise ValueError(f"stacks must be both, policy or memory, got {stacks!r}")
        model.stacks = stacks
    if weights:
        model.load_weights(weights)
    if mu is not None:  # set explicitly at run time (tests: mu = 0 checks the policy alone on the same engine)
        if not mu >= 0:
            raise ValueError(f"DLC mu must be >= 0, got {mu}")
        model.mu = float(mu)
    return len(weights or ())


def push(llm, weights: list[tuple[str, torch.Tensor]] | None = None, mu: float | None = None, stacks=None) -> None:
    """Send new weights (``memory.*`` or policy names) and/or mu to every worker of ``llm`` (CPU path).

    Needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (the function is pickled to the worker); the prefix cache
    is reset, or prompts cached under the old weights would be reused.
    """
    weights = [(n, t.detach().cpu().contiguous()) for n, t in (weights or [])]
    llm.apply_model(functools.partial(update, weights=weights, mu=mu, stacks=stacks))
    llm.reset_prefix_cache()


# ------------------------------------------------------------------------------------- divergence check
@torch.no_grad()
def composite_logprobs(policy, memory, mu: float, sequences: torch.Tensor, response_mask: torch.Tensor):
    """``log_softmax(f_theta - mu f_phi)`` of each token of ``sequences`` (B, L) from two HF models.

    Returns (B, L) with the log-prob of token t given tokens < t (0 at t = 0 and where ``response_mask``,
    (B, L) bool, is False). Rows are right-padded: padding follows the last True of the mask.
    """
    attention = torch.ones_like(sequences, dtype=torch.bool)
    last = response_mask.long().cumsum(-1).argmax(-1)  # padding after each row's last response token
    attention &= torch.arange(sequences.shape[1], device=sequences.device)[None, :] <= last[:, None]
    policy_logits = policy(input_ids=sequences, attention_mask=attention.long()).logits[:, :-1].float()
    memory_logits = memory(input_ids=sequences, attention_mask=attention.long()).logits[:, :-1].float()
    logp = calibrated_logits(policy_logits, memory_logits, mu).log_softmax(-1)
    out = torch.zeros(sequences.shape, dtype=torch.float32, device=sequences.device)
    out[:, 1:] = logp.gather(-1, sequences[:, 1:, None]).squeeze(-1)
    return out.masked_fill(~response_mask, 0.0)


def divergence(sample_logprobs: torch.Tensor, recomputed: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampling logprobs are from the recomputed composite, over the masked tokens.

    ``check_mean_abs``/``check_max_abs``: |log q_engine - log q_recomputed|; ``check_kl_k1``: the mean of
    ``log q_engine - log q_recomputed`` over tokens sampled from the engine, an estimate of KL(engine || recomputed).
    """
    mask = mask.bool()
    if not mask.any():
        raise ValueError("divergence check: no tokens in the mask")
    diff = (sample_logprobs.float() - recomputed.float())[mask]
    return {
        "check_mean_abs": float(diff.abs().mean()),
        "check_max_abs": float(diff.abs().max()),
        "check_kl_k1": float(diff.mean()),
        "check_tokens": int(mask.sum()),
    }
