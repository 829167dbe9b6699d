"""Distribution-Level Calibration (DLC, Section 3.2; Algorithm 1 lines 4-6 and 21-22).

Rollouts are drawn from ``softmax(f_theta - mu * f_phi)`` where ``f_phi`` are the logits of a memory network
``m_phi`` trained, after each step, with cross-entropy on the outputs that were sampled, so it tracks how often
each output has been generated. The functions work on logits of any shape ``(..., vocab)``: a label set in the
toy, the next-token vocabulary in the trainers and the composite vLLM model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a formula runs: the config check reads IMPORTANCE torch-free
    import torch


def calibrated_logits(policy_logits: torch.Tensor, memory_logits: torch.Tensor, mu: float) -> torch.Tensor:
    """``f~ = f_theta - mu * f_phi`` (Section 3.2; Algorithm 1 line 5). ``mu = 0`` is plain sampling."""
    if mu < 0:
        raise ValueError(f"DLC mu must be >= 0 (Section 3.2), got {mu}")
    if mu == 0:
        return policy_logits
    return policy_logits - mu * memory_logits.to(policy_logits.dtype)


IMPORTANCE = ("none", "truncated")
"""What the policy gradient does about DLC sampling from softmax(f~), not pi_theta (``grid.train.dlc_importance``).

``none`` (the default, Algorithm 1 as written): line 20 updates theta with the calibrated advantages of the
samples drawn at line 6 and no correction for where they came from; the PPO ratio is against pi_theta_old.
``truncated``: each token's loss is weighted by ``clamp(pi_theta_old / pi_sample, *IMPORTANCE_BOUNDS)``, a
truncated importance weight towards pi_theta (OpenRLHF's ``is_correction`` token/clip with the same bounds).
"""
IMPORTANCE_BOUNDS = (0.5, 5.0)  # OpenRLHF 0.11.2's default --algo.advantage.is_correction_threshold


def importance_weights(old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-token weights of the policy loss for samples drawn from DLC's distribution (see ``IMPORTANCE``).

    ``old_logprobs``: log pi_theta_old of the sampled tokens; ``sampling_logprobs``: their log-probs under the
    distribution they were drawn from. No gradient flows through the weights.
    """
    import torch

    if mode == "none":
        return torch.ones_like(old_logprobs)
    if mode == "truncated":
        low, high = IMPORTANCE_BOUNDS
        return (old_logprobs - sampling_logprobs).detach().exp().clamp(min=low, max=high)
    raise ValueError(f"grid.train.dlc_importance must be one of {IMPORTANCE}, got {mode!r}")


def memory_loss(memory_logits: torch.Tensor, sampled: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the memory network on the sampled outputs (Section 3.2; Algorithm 1 line 22).

    ``memory_logits`` has shape ``(..., vocab)`` and ``sampled`` the matching ids; minimising it raises ``f_phi``
    on frequently generated outputs, so the memory becomes a frequency prior. Ids equal to ``-100`` are ignored
    (padding). ``reduction`` "sum" lets a trainer that sees a step's samples in pieces take the mean over all of
    them (the sum of the pieces over the step's token count), which both trainers do.
    """
    import torch.nn.functional as F

    return F.cross_entropy(memory_logits.reshape(-1, memory_logits.shape[-1]), sampled.reshape(-1), reduction=reduction)
