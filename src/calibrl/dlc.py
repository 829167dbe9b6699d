"""Distribution-Level Calibration (DLC, Section 3.2; Algorithm 1 lines 4-6 and 21-22).

Rollouts are drawn from ``softmax(f_theta - mu * f_phi)`` where ``f_phi`` are the logits of a
memory network ``m_phi`` trained, after each step, with cross-entropy on the outputs that were
sampled, so it tracks how often each output has been generated. The functions work on logits of
any shape ``(..., vocab)``: a label set in the toy, the next-token vocabulary in the trainers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def calibrated_logits(policy_logits: torch.Tensor, memory_logits: torch.Tensor, mu: float) -> torch.Tensor:
    """``f~ = f_theta - mu * f_phi`` (Section 3.2; Algorithm 1 line 5). ``mu = 0`` is plain sampling."""
    if mu < 0:
        raise ValueError(f"DLC mu must be >= 0 (Section 3.2), got {mu}")
    if mu == 0:
        return policy_logits
    return policy_logits - mu * memory_logits.to(policy_logits.dtype)


def sampling_distribution(policy_logits: torch.Tensor, memory_logits: torch.Tensor, mu: float) -> torch.Tensor:
    """``pi_sample(o|q) proportional to exp(f~(q, o))`` (Section 3.2), as probabilities over the last axis."""
    return torch.softmax(calibrated_logits(policy_logits, memory_logits, mu), dim=-1)


def memory_loss(memory_logits: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the memory network on the sampled outputs (Section 3.2; Algorithm 1 line 22).

    ``memory_logits`` has shape ``(N, vocab)`` and ``sampled`` holds the N sampled ids; minimising
    it raises ``f_phi`` on frequently generated outputs, so the memory becomes a frequency prior.
    Ids equal to ``-100`` are ignored (padding), as in ``torch.nn.functional.cross_entropy``.
    """
    return F.cross_entropy(memory_logits.reshape(-1, memory_logits.shape[-1]), sampled.reshape(-1))
