"""DLC (Section 3.2) with Hugging Face generation: the slow path, for small models and tests.

DLC samples rollouts from ``softmax(f_theta - mu * f_phi)`` (``calibrl.dlc.calibrated_logits``), where
``f_phi`` are the logits of a memory network m_phi trained after every step with cross-entropy on that
step's rollouts (Algorithm 1 lines 4-6, 21-22).

Paper scale runs on vLLM instead: ``vllm_dlc`` (the composite policy+memory vLLM model), ``memory_actor``
(m_phi's trainer as a Ray actor) and ``openrlhf_dlc`` (their hook into OpenRLHF 0.11.2). This module is the
path the notes call "pure HF generation": ``DLCLogitsProcessor`` is a transformers logits processor that
advances the memory model beside the policy in ``model.generate`` (its own ``DynamicCache``, positions and
mask following the policy's) and returns ``calibrated_logits(f_theta, f_phi, mu)``. transformers applies
custom processors before temperature and top-k/top-p (``generation/utils.py`` L1594 then L1613 in 5.x), so
tokens come from ``softmax((f_theta - mu f_phi) / T)``, as in vLLM's order and ``calibrl.sampling``.
``generate`` wraps it with explicit sampling settings (Qwen3's generation_config would otherwise impose
top_k 20, top_p 0.95, temperature 0.6) and ``memory_step`` is Algorithm 1 line 22 (``calibrl.dlc.memory_loss``
on the sampled response tokens). Hugging Face generation is ~5-20x slower than vLLM for long RL rollouts.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from calibrl.dlc import calibrated_logits, memory_loss


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
