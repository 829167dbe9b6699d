"""Batched autoregressive rollouts with KV caches: the rollout engine of the CPU trainers.

With a memory model and ``mu > 0`` the next token is drawn from DLC's calibrated distribution
``softmax(f_theta - mu * f_phi)`` (Section 3.2; Algorithm 1 lines 4-6): policy and memory are advanced
token by token in the same loop, each with its own ``DynamicCache``. Temperature and nucleus (top-p)
filtering are applied after calibration, and the returned log-probs are those of the distribution the
tokens were actually drawn from.

Layout: prompts are ``<bos>`` + characters, left-padded to a common width ``P``; the response block
of width ``T`` follows, right-padded with ``<pad>`` after each row's ``<eos>``. Positions count real
tokens only (``cumsum(mask) - 1``), so a left-padded row sees the same positions as the unpadded one.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from calibrl.algo.dlc import calibrated_logits


@dataclass
class Rollout:
    """``B = len(prompts) * group_size`` rollouts; prompt ``i``'s samples are rows ``i*G .. i*G+G-1``.

    sequences:      (B, P+T) long, left-padded prompt then response (pad after ``<eos>``)
    prompt_len:     P, the padded prompt width
    response_mask:  (B, T) bool, True for generated tokens up to and including ``<eos>``
    logprobs:       (B, T) float, log-prob of each generated token under the sampling distribution used
                    (after DLC, temperature and top-p); 0 where ``response_mask`` is False
    entropy:        (B, T) float, entropy of the policy's own temperature-1 next-token distribution
    texts:          decoded responses, special tokens removed
    attention_mask: (B, P+T) bool, prompt padding mask followed by ``response_mask``; the mask that
                    reproduces the sampling-time forward pass without a cache
    """

    sequences: torch.Tensor
    prompt_len: int
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    texts: list[str]
    attention_mask: torch.Tensor | None = None

    def rows(self, idx: torch.Tensor) -> Rollout:
        """The rollouts of rows ``idx`` (a 1-D index tensor)."""
        mask = None if self.attention_mask is None else self.attention_mask[idx]
        texts = [self.texts[i] for i in idx.tolist()] if self.texts else []
        return Rollout(self.sequences[idx], self.prompt_len, self.response_mask[idx], self.logprobs[idx],
                       self.entropy[idx], texts, mask)  # fmt: skip

    @property
    def responses(self) -> torch.Tensor:
        """(B, T) generated token ids (pad after ``<eos>``)."""
        return self.sequences[:, self.prompt_len :]

    @property
    def position_ids(self) -> torch.Tensor:
        """(B, P+T) the position ids used while sampling."""
        if self.attention_mask is None:
            raise ValueError("this Rollout carries no attention_mask")
        return position_ids_from_mask(self.attention_mask)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only attended tokens: ``cumsum(mask) - 1``, clamped to 0 on left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``<bos>`` + prompt characters, left-padded: ``(input_ids, attention_mask)``, both (N, P).

    Python work is per distinct prompt only; ``sample`` repeats the rows for the group on tensors.
    """
    if not prompts:
        raise ValueError("no prompts given")
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    width = 1 + max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.bool)
    for row, ids in enumerate(encoded):
        start = width - 1 - len(ids)
        input_ids[row, start] = tokenizer.bos_token_id
        input_ids[row, start + 1 :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, start:] = True
    return input_ids, attention_mask


@functools.cache
def _cache_kwarg(model_class: type) -> str:
    """The name ``model_class.forward`` takes the KV cache under: ``cache`` since transformers 5.2x, where
    ``past_key_values`` still works but warns in every job; ``past_key_values`` before."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _last_logits(model, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
    """Float32 next-token logits (B, V) at the last position, appending the step to ``cache``."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=cache is not None,
        logits_to_keep=1,
        **{_cache_kwarg(type(model)): cache},
    )
    return out.logits[:, -1].float()


def _prefill(model, prompt_ids, prompt_mask, position_ids, cache, group_size: int) -> torch.Tensor:
    """The prompts' next-token logits, each row repeated ``group_size`` times, with ``cache`` repeated alike."""
    logits = _last_logits(model, prompt_ids, prompt_mask, position_ids, cache)
    cache.batch_repeat_interleave(group_size)
    return logits.repeat_interleave(group_size, dim=0)


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of top tokens whose probability reaches ``top_p``.

    A token is dropped when the mass of the tokens ranked above it already reaches ``top_p``, so the
    most likely token is always kept and a tiny ``top_p`` means greedy decoding.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` most likely tokens (ties at the k-th value kept), as vLLM's ``top_k``."""
    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _check_args(group_size: int, max_new_tokens: int, temperature: float, top_p: float, memory, mu: float):
    if group_size < 1 or max_new_tokens < 1:
        raise ValueError(f"group_size and max_new_tokens must be >= 1, got {group_size}, {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if mu < 0:
        raise ValueError(f"DLC mu must be >= 0 (Section 3.2), got {mu}")
    if mu > 0 and memory is None:
        raise ValueError(f"DLC with mu={mu} needs a memory model")


@torch.no_grad()
def sample(
    policy,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    memory=None,
    mu: float = 0.0,
    generator: torch.Generator | None = None,
    top_k: int = 0,
) -> Rollout:
    """Sample ``group_size`` responses per prompt, all rows batched, one forward per model per token.

    Next-token logits are ``calibrated_logits(f_theta, f_phi, mu)`` (just ``f_theta`` without memory
    or with ``mu = 0``), divided by ``temperature`` (``0`` means greedy, with log-prob 0), cut to the
    ``top_k`` most likely tokens (``0``: all), nucleus filtered with ``top_p`` (vLLM's order), and drawn
    with ``torch.multinomial(..., generator=generator)``. Rows that
    emitted ``<eos>`` then emit ``<pad>`` (masked out of attention); the loop stops once every row has
    finished or after ``max_new_tokens``. The result is a function of the models, the arguments and
    the generator state only. The models' train/eval mode is left as it is.
    """
    _check_args(group_size, max_new_tokens, temperature, top_p, memory, mu)
    use_memory = memory is not None and mu > 0
    device = next(policy.parameters()).device
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id

    # The prompt is read once per distinct prompt and its KV cache repeated for the group: the prefill's work
    # (more than half of a countdown evaluation's, whose prompts outnumber its answers' tokens) does not grow with G.
    prompt_ids, prompt_mask = (t.to(device) for t in encode_prompts(tokenizer, prompts))
    position_ids = position_ids_from_mask(prompt_mask)
    policy_cache = DynamicCache(config=policy.config)
    policy_logits = _prefill(policy, prompt_ids, prompt_mask, position_ids, policy_cache, group_size)
    memory_cache = memory_logits = None
    if use_memory:
        memory_cache = DynamicCache(config=memory.config)
        memory_logits = _prefill(memory, prompt_ids, prompt_mask, position_ids, memory_cache, group_size)
    prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
    batch, prompt_len = prompt_ids.shape

    # The mask grows by one column per step; preallocate it and hand the models growing views.
    attention_mask = torch.zeros((batch, prompt_len + max_new_tokens), dtype=torch.bool, device=device)
    attention_mask[:, :prompt_len] = prompt_mask
    next_position = position_ids[:, -1:].repeat_interleave(group_size, dim=0) + 1

    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    entropy = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    steps = max_new_tokens
    for t in range(max_new_tokens):
        alive = ~finished
        logits = calibrated_logits(policy_logits, memory_logits, mu) if use_memory else policy_logits
        if temperature == 0:
            token = logits.argmax(dim=-1)
            token_logprob = torch.zeros(batch, dtype=torch.float32, device=device)
        else:
            if temperature != 1:
                logits = logits / temperature
            if top_k > 0:
                logits = _filter_top_k(logits, top_k)
            if top_p < 1:
                logits = _filter_top_p(logits, top_p)
            logp = logits.log_softmax(dim=-1)
            token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            token_logprob = logp.gather(-1, token[:, None]).squeeze(-1)
        policy_logp = policy_logits.log_softmax(dim=-1)
        token_entropy = -(policy_logp.exp() * policy_logp).sum(dim=-1)

        token = token.masked_fill(finished, pad_id)
        tokens[:, t] = token
        logprobs[:, t] = token_logprob.masked_fill(finished, 0.0)
        entropy[:, t] = token_entropy.masked_fill(finished, 0.0)
        attention_mask[:, prompt_len + t] = alive
        finished |= token == eos_id
        if t + 1 == max_new_tokens or bool(finished.all()):
            steps = t + 1
            break

        step_ids = token[:, None]
        step_mask = attention_mask[:, : prompt_len + t + 1]
        policy_logits = _last_logits(policy, step_ids, step_mask, next_position, policy_cache)
        if use_memory:
            memory_logits = _last_logits(memory, step_ids, step_mask, next_position, memory_cache)
        next_position = next_position + 1

    tokens, response_mask = tokens[:, :steps], attention_mask[:, prompt_len : prompt_len + steps]
    texts = tokenizer.batch_decode(tokens.tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return Rollout(
        sequences=torch.cat([prompt_ids, tokens], dim=1),
        prompt_len=prompt_len,
        response_mask=response_mask.clone(),
        logprobs=logprobs[:, :steps].clone(),
        entropy=entropy[:, :steps].clone(),
        texts=texts,
        attention_mask=attention_mask[:, : prompt_len + steps].clone(),
    )
