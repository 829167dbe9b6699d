"""Advantage estimators of the paper and Inverse-success Advantage Calibration (IAC).

Every estimator maps a reward tensor of shape ``(..., groups, G)`` to advantages of the same
shape: the last axis holds the G responses sampled for one query, the axis before it the
queries of one batch, and any leading axes are independent batches (the toy vectorises seeds
there). Batch-level statistics (Reinforce++ whitening) are taken over the last two axes only,
so independent batches never see each other.

The toy (``calibrl.toy``), the local trainer and the OpenRLHF patch all call these functions,
so each formula exists exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EPS = 1e-6
"""Added to standard deviations, as verl and OpenRLHF do, so all-equal groups give 0 not NaN."""


def raw_reward(rewards: torch.Tensor) -> torch.Tensor:
    """A = r: the raw verifiable reward used as advantage (Section 2.4, "raw reward")."""
    return rewards.clone()


def mean_shifted(rewards: torch.Tensor) -> torch.Tensor:
    """A = r - mean_G(r): the group-mean baseline (Section 2.4, "mean-shifted")."""
    return rewards - rewards.mean(dim=-1, keepdim=True)


def grpo_normalized(rewards: torch.Tensor) -> torch.Tensor:
    """A = (r - mean_G(r)) / (std_G(r) + eps): GRPO's normalized advantage (Section 2.4, Thm 2.3).

    ``std`` is the unbiased sample standard deviation (Bessel's correction), as in GRPO's
    reference implementations in verl (``torch.std``) and OpenRLHF; Theorem 2.3 calls it the
    empirical standard deviation sigma.
    """
    centered = mean_shifted(rewards)
    std = rewards.std(dim=-1, keepdim=True, correction=1) if rewards.shape[-1] > 1 else 0.0
    return centered / (std + EPS)


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """A_s = r_s - (sum_{j != s} r_j) / (G - 1): the leave-one-out baseline (Kool et al., 2019)."""
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError("RLOO needs a group size G >= 2")
    total = rewards.sum(dim=-1, keepdim=True)
    return rewards - (total - rewards) / (g - 1)


def whiten(advantages: torch.Tensor) -> torch.Tensor:
    """Batch whitening: minus the mean, over the unbiased std, of all ``groups x G`` values of one batch
    (the last two axes), as OpenRLHF's ``reinforce_baseline`` does."""
    flat = advantages.flatten(start_dim=-2)
    mean = flat.mean(dim=-1, keepdim=True).unsqueeze(-1)
    std = flat.std(dim=-1, keepdim=True, correction=1).unsqueeze(-1) if flat.shape[-1] > 1 else 0.0
    return (advantages - mean) / (std + EPS)


def reinforce_pp_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """Reinforce++ with baseline (Hu et al.): subtract the group mean, then whiten over the batch."""
    return whiten(mean_shifted(rewards))


def drgrpo(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al., 2025): the group-mean baseline without the std division.

    Dr. GRPO also drops the per-response length normalisation of the loss; that belongs to the
    trainer's loss aggregation (``token-sum / constant``), not to the advantage.
    """
    return mean_shifted(rewards)


Estimator = Callable[[torch.Tensor], torch.Tensor]

ESTIMATORS: dict[str, Estimator] = {
    "raw": raw_reward,
    "mean": mean_shifted,
    "norm": grpo_normalized,
    "grpo": grpo_normalized,
    "rloo": rloo,
    "rpp": reinforce_pp_baseline,
    "drgrpo": drgrpo,
}
"""Estimators by name. ``grpo`` is an alias of ``norm``; the toy CLI uses the short names."""


def get_estimator(name: str) -> Estimator:
    """Look an estimator up by name, with an error that lists the valid names."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(ESTIMATORS)}") from None


def iac_factor(advantages: torch.Tensor, alpha: float) -> torch.Tensor:
    """The inverse-success factor (G - |S+|)^alpha of each group (Algorithm 1, lines 11-14).

    ``S+ = {s : A_s > 0}`` (Algorithm 1 line 11), on the group-baseline advantages, is the one definition
    used everywhere (toy, CPU trainer, OpenRLHF patch). Section 3.1 and line 12 call |S+| the success
    count: with binary rewards and a group baseline the two agree in every group with both outcomes (A > 0
    exactly for the correct samples), and in a group without both every A is 0, so nothing is scaled under
    either reading. They differ only for shaped rewards (DAPO's overlong penalty): a correct but overlong
    response below its group's mean is not a positive sample, and is neither scaled nor counted, matching
    Section 3.1's "we only calibrate the advantages of positive samples".
    ``0 ** 0 == 1``, so alpha = 0 gives a factor of exactly 1 everywhere.
    """
    if alpha < 0:
        raise ValueError(f"IAC alpha must be >= 0 (Section 3.1), got {alpha}")
    g = advantages.shape[-1]
    n_pos = (advantages > 0).sum(dim=-1, keepdim=True).to(advantages.dtype)
    return torch.pow(g - n_pos, alpha)


def iac(advantages: torch.Tensor, alpha: float) -> torch.Tensor:
    """Inverse-success Advantage Calibration (Section 3.1, Algorithm 1 lines 11-18).

    ``A~(q, o+) = A(q, o+) * (G - |S+|)^alpha`` for every positive advantage; negative (and zero)
    advantages are returned unchanged. With ``alpha == 0`` the input is returned bit for bit.
    """
    if alpha < 0:
        raise ValueError(f"IAC alpha must be >= 0 (Section 3.1), got {alpha}")
    if alpha == 0:
        return advantages.clone()
    factor = iac_factor(advantages, alpha)
    return torch.where(advantages > 0, advantages * factor, advantages)


def compute_advantages(rewards: torch.Tensor, estimator: str, iac_alpha: float = 0.0) -> torch.Tensor:
    """Estimator by name, with IAC (``iac_alpha``; 0 = uncalibrated) on its group advantages.

    Reinforce++: IAC goes between the group baseline and the batch whitening (whiten(IAC(r - mean_G r))),
    where OpenRLHF's code puts it too (``calibrl.train.openrlhf.iac_patch``: IAC on the group advantages,
    then OpenRLHF whitens), so both trainers run the same formula."""
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if estimator == "rpp":
        return whiten(iac(mean_shifted(rewards), iac_alpha)) if iac_alpha else reinforce_pp_baseline(rewards)
    return iac(get_estimator(estimator)(rewards), iac_alpha)
