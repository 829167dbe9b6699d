"""DLC (Section 3.2) at paper scale: the design decision, and the path that is implemented.

DLC samples rollouts from ``softmax(f_theta - mu * f_phi)`` (``calibrl.dlc.calibrated_logits``), where
``f_phi`` are the logits of a memory network m_phi (the paper: Qwen3-1.7B, mu = 0.5) trained after every
step with cross-entropy on that step's rollouts (Algorithm 1 lines 4-6, 21-22).

Decision: the slow Hugging Face path is implemented; the vLLM design is not, and the OpenRLHF launcher
refuses ``dlc_mu > 0`` (``require_scalable_dlc``) instead of training without DLC.

* Recommended design (notes, section 4): a composite vLLM model, registered out of tree through the
  ``vllm.general_plugins`` entry point, holding the policy and the memory as two Qwen3 stacks that run on
  the same tokens, with ``compute_logits`` returning ``f_theta - mu * f_phi``; ``load_weights`` routing
  ``memory.*`` names to the memory; a GPU Ray actor training m_phi after each step (hooked on
  ``BasePPOTrainer.train_step``) and pushing its weights to every engine. It keeps vLLM's batching, paged
  KV cache and CUDA graphs, so its expected rollout overhead is about 1.2-1.5x (the memory reads ~1.7/8 of
  the 8B policy's bytes per decode step), below the paper's 5x. It is not built here because it cannot be
  made sound without running it: it depends on vLLM 0.29 model-runner internals (plugin registration, two
  attention stacks with distinct layer prefixes in one KV-cache group, logits computation, weight loading,
  CUDA-graph capture), on a second weight-sync channel, and on GPUs; vLLM has no CPU wheel and this
  machine has no GPU. A mistake there either crashes at scale or, worse, silently samples from the wrong
  distribution, which no CPU test of ours would catch.
* The "middle" option, a vLLM V1 ``LogitsProcessor`` holding a Hugging Face memory model, is rejected
  for the same reason and for cost: one Python forward per request per decode step, per-request KV caches
  outside vLLM's memory budget (~112 KB/token for Qwen3-1.7B: 235 GB for 512 sequences of 4k tokens),
  and ``async_scheduling`` must be off.
* Implemented: the path the notes call "pure HF generation". ``DLCLogitsProcessor`` is a transformers
  logits processor that advances the memory model beside the policy in ``model.generate`` (its own
  ``DynamicCache``, positions and mask following the policy's) and returns
  ``calibrated_logits(f_theta, f_phi, mu)``. transformers applies custom processors before temperature
  and top-k/top-p (``generation/utils.py`` L1594 then L1613 in 5.x), so tokens come from
  ``softmax((f_theta - mu f_phi) / T)``, as in vLLM's order and ``calibrl.sampling``. ``generate`` wraps
  it with explicit sampling settings (Qwen3's generation_config would otherwise impose top_k 20, top_p
  0.95, temperature 0.6) and ``memory_step`` is Algorithm 1 line 22 (``calibrl.dlc.memory_loss`` on the
  sampled response tokens). Both run on CPU with tiny Qwen3 models in the tests.

Why the HF path cannot simply be plugged into the OpenRLHF runs: OpenRLHF 0.11.2 rolls out only through
vLLM (``samples_generator.py`` imports vllm at L7; ``_generate_vllm`` L140-193 is the only generator), and
the policy's current weights exist only in the DeepSpeed actors and the vLLM engines (synced by NCCL
broadcast, ``ppo_actor.py`` L409-490). Using this path there means a Ray actor that stands in for
``RolloutRayActor`` (``generate_responses``, ``init_process_group``/``update_weight`` joining the weight
broadcast, ``sleep``/``wake_up``), generating with this module and training m_phi on what it generated:
GPU-only code that cannot be exercised here either.

Expected overhead of the HF path against vLLM rollouts without DLC: Hugging Face generation alone is
~5-20x slower than vLLM for long RL rollouts (padded static batches, no paged attention or continuous
batching, a Python loop per token), and the memory adds one forward per token (~20% of the policy's
weight reads, but as many kernel launches): roughly 7-40x in all, against the paper's reported 5x. It is
for small models and unit tests; paper-scale DLC needs the composite model above.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from calibrl.dlc import calibrated_logits, memory_loss


def require_scalable_dlc(mu: float, memory: str | None) -> None:
    """Raise: paper-scale DLC (vLLM rollouts from ``f_theta - mu f_phi``) is not available in this backend."""
    raise NotImplementedError(
        f"DLC (dlc_mu={mu}, memory {memory!r}) is not available with the OpenRLHF/vLLM backend: the vLLM "
        "composite-model design is not implemented (it cannot be verified without GPUs and vLLM), and "
        "OpenRLHF 0.11.2 rolls out through vLLM only. See calibrl.train.openrlhf.dlc for the decision and the "
        "Hugging Face path that exists; run DLC methods with the local trainer or leave them out of the grid."
    )


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting attended tokens only (left padding gets 0), as ``calibrl.sampling`` uses."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


class DLCLogitsProcessor(LogitsProcessor):
    """``f_theta - mu * f_phi`` for Hugging Face ``generate``: the memory model runs beside the policy.

    ``attention_mask`` is the (left-padded) prompt mask given to ``generate``; rows repeated by
    ``num_return_sequences`` are matched by repeating it. The first call runs the memory on the whole
    prompt, later calls on the tokens appended since (one per step), with the attention mask extended by
    ones as ``generate`` extends the policy's. One instance serves one ``generate`` call.
    """

    def __init__(self, memory, mu: float, attention_mask: torch.Tensor):
        if mu < 0:
            raise ValueError(f"DLC mu must be >= 0 (Section 3.2), got {mu}")
        self.memory, self.mu = memory, float(mu)
        self.mask = attention_mask.bool()
        self.cache: DynamicCache | None = None

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.mu == 0:
            return scores
        rows = input_ids.shape[0]
        if self.cache is None:
            if rows % self.mask.shape[0] or input_ids.shape[1] != self.mask.shape[1]:
                raise ValueError(f"prompt mask {tuple(self.mask.shape)} does not match input {tuple(input_ids.shape)}")
            self.mask = self.mask.repeat_interleave(rows // self.mask.shape[0], dim=0).to(input_ids.device)
            self.cache = DynamicCache(config=self.memory.config)
            new_ids, new_pos = input_ids, positions(self.mask)
        else:
            grown = input_ids.shape[1] - self.mask.shape[1]
            if grown < 1 or rows != self.mask.shape[0]:
                raise ValueError("DLCLogitsProcessor serves one generate call: make a new one for each")
            self.mask = torch.cat([self.mask, self.mask.new_ones((rows, grown))], dim=1)
            new_ids, new_pos = input_ids[:, -grown:], positions(self.mask)[:, -grown:]
        out = self.memory(
            input_ids=new_ids,
            attention_mask=self.mask,
            position_ids=new_pos,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        memory_logits = out.logits[:, -1].float()
        return calibrated_logits(scores.float(), memory_logits, self.mu).to(scores.dtype)


@torch.no_grad()
def generate(
    policy,
    memory,
    mu: float,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    num_samples: int,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Sample ``num_samples`` responses per (left-padded) prompt from DLC's distribution; returns sequences.

    Rows ``i * num_samples ... (i + 1) * num_samples - 1`` belong to prompt ``i``; the response block starts
    at column ``input_ids.shape[1]``. Sampling is exactly ``softmax((f_theta - mu f_phi) / temperature)``
    with nucleus ``top_p`` and no top-k (``mu = 0`` or ``memory=None``: plain policy sampling).
    """
    config = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=num_samples,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    processors = LogitsProcessorList()
    if memory is not None and mu > 0:
        processors.append(DLCLogitsProcessor(memory, mu, attention_mask))
    return policy.generate(
        input_ids=input_ids, attention_mask=attention_mask, generation_config=config, logits_processor=processors
    )


def response_mask(sequences: torch.Tensor, prompt_len: int, eos_token_id: int) -> torch.Tensor:
    """(B, L) True on generated tokens up to and including each row's first ``<eos>``."""
    generated = torch.zeros_like(sequences, dtype=torch.bool)
    tail = sequences[:, prompt_len:]
    before_eos = (tail == eos_token_id).long().cumsum(-1) - (tail == eos_token_id).long() == 0
    generated[:, prompt_len:] = before_eos
    return generated


def memory_step(memory, optimizer, sequences: torch.Tensor, attention_mask: torch.Tensor, generated: torch.Tensor):
    """One cross-entropy step of m_phi on the sampled responses (Algorithm 1 line 22); returns the loss.

    ``attention_mask`` covers prompt and response (B, L); ``generated`` marks the response tokens to learn
    (``response_mask``). Token t is predicted from the logits at t - 1.
    """
    memory.train()
    mask = attention_mask.bool() & (generated | ~generated.cumsum(-1).bool())  # nothing after the response
    logits = memory(input_ids=sequences, attention_mask=mask, position_ids=positions(mask)).logits[:, :-1]
    targets = sequences[:, 1:].masked_fill(~generated[:, 1:], -100)
    loss = memory_loss(logits.float(), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
