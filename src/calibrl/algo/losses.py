"""The policy-gradient loss: PPO's clipped surrogate with dual clip, KL estimators, and loss aggregation.

Per-token tensors are (B, T) with a (B, T) mask of response tokens. Each formula is written once here; the CPU
trainer calls these functions, and the OpenRLHF backend maps the same names to OpenRLHF's own implementation of
them or patches this module's function in (Dr. GRPO's constant normaliser).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from calibrl.algo.registry import Registry

if TYPE_CHECKING:  # torch is imported where a formula runs: the config check reads the names torch-free
    import torch

KL_ESTIMATORS: Registry[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = Registry("KL estimator")
AGGREGATIONS: Registry[Callable[..., torch.Tensor]] = Registry("loss aggregation")


# ------------------------------------------------------------------------------------------------ KL
@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log(pi / pi_ref), per token (Schulman, "Approximating KL divergence"; OpenRLHF and verl ``kl``)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = r - 1 - log r with r = pi_ref / pi, per token (Schulman; verl's ``low_var_kl``, OpenRLHF ``k3``)."""
    import torch

    log_ratio = logp - ref_logp
    return torch.exp(-log_ratio) - 1 + log_ratio


# ---------------------------------------------------------------------------------------- aggregation
@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """GRPO's mean over each response's tokens, then over responses."""
    mask = mask.to(per_token.dtype)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


@AGGREGATIONS.register("token-mean")
def token_mean(per_token: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """DAPO's (and verl's default) mean over every token of the batch: long responses weigh more."""
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    per_token: torch.Tensor, mask: torch.Tensor, max_len: int, sequences: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Dr. GRPO's token sums over one constant, the generation budget ``max_len`` (verl's
    ``seq-mean-token-sum-norm``): ``sum_i sum_t l_it / (B * max_len)``. ``sequences`` is B when the rows of
    ``per_token`` are not the step's responses one per row (OpenRLHF's packed, data-parallel micro-batches)."""
    mask = mask.to(per_token.dtype)
    sums = ((per_token * mask).sum(-1) / max_len).sum()
    return sums / (per_token.shape[0] if sequences is None else sequences)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar with the aggregation ``mode`` (``AGGREGATIONS``)."""
    return AGGREGATIONS[mode](per_token, mask, max_len)


# ------------------------------------------------------------------------------------------ policy
def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss ``max(-A r, -A clip(r, 1 - low, 1 + high))`` (Schulman et al., 2017; DAPO's
    asymmetric clip-higher), and for negative advantages bounded by ``-A * dual_clip`` (dual clip, Ye et al.,
    2020; verl's ``clip_ratio_c``, OpenRLHF's ``--actor.dual_clip``). ``advantages`` is (B,) per response or
    (B, T). Returns the loss and the indicator of tokens where a clip was active."""
    import torch

    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -adv * dual_clip
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        active = active | dual
    return loss, active.float()
