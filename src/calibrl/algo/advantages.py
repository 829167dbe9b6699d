"""Advantage estimators and Inverse-success Advantage Calibration (IAC, Section 3.1).

An estimator maps rewards of shape ``(..., groups, G)`` to advantages of the same shape: the last axis holds the
G responses sampled for one query, the axis before it the queries of one batch, and leading axes are independent
batches (the toy vectorises seeds there). It has two stages, as in verl's ``core_algos.py`` and OpenRLHF's
``compute_advantages_and_returns``: a *group* baseline (per query), then optionally a *batch* transform
(Reinforce++'s whitening over the batch). IAC is a transform of the group advantages of any estimator, applied
between the two stages (Algorithm 1 lines 11-18): ``advantages(r) = batch(iac(group(r), alpha))``.

A new estimator is one decorated function::

    @estimator("my_baseline")
    def my_baseline(rewards):            # (..., groups, G) -> (..., groups, G)
        return rewards - rewards.median(dim=-1, keepdim=True).values

after which ``grid.methods.<name>.estimator: my_baseline`` is a valid config (the schema's enum is this
registry) and the CPU trainer uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from calibrl.algo.registry import Registry

if TYPE_CHECKING:  # torch is imported where a formula runs: the config check reads the names torch-free
    import torch

EPS = 1e-6
"""Added to group standard deviations, as verl and OpenRLHF do, so all-equal groups give 0 not NaN."""
VAR_FLOOR = 1e-8
"""The least variance Reinforce++'s whitening divides by (OpenRLHF 0.11.2: ``var.clamp(min=1e-8).rsqrt()``)."""


@dataclass(frozen=True)
class Estimator:
    group: Callable[[torch.Tensor], torch.Tensor]
    batch: Callable[..., torch.Tensor] | None = None  # (advantages, weights=None) -> advantages


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def estimator(name: str, *aliases: str, batch: Callable[..., torch.Tensor] | None = None):
    """Register the decorated group-baseline function as estimator ``name`` (``batch``: a batch transform
    applied after IAC). Returns the function unchanged."""

    def add(fn: Callable[[torch.Tensor], torch.Tensor]):
        ESTIMATORS.register(name, *aliases)(Estimator(fn, batch))
        return fn

    return add


def whiten(advantages: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Reinforce++'s batch whitening over the last two axes (the ``groups x G`` values of one batch), over every
    response token of the batch as OpenRLHF 0.11.2's ``reinforce_baseline`` does (``compute_advantages_and_returns``,
    "Normalize advantages across all experiences"): a response's advantage counts once per token, ``weights`` (same
    shape) being each response's token count (None: one token each); minus the token mean, times
    ``rsqrt(max(var, VAR_FLOOR))`` with ``var`` the token mean of the squared deviations (no Bessel correction)."""
    import torch

    flat = advantages.flatten(start_dim=-2)
    w = torch.ones_like(flat) if weights is None else weights.to(flat.dtype).flatten(start_dim=-2)
    total = w.sum(dim=-1, keepdim=True)
    mean = (w * flat).sum(dim=-1, keepdim=True) / total
    var = (w * (flat - mean) ** 2).sum(dim=-1, keepdim=True) / total
    return (advantages - mean.unsqueeze(-1)) * var.clamp(min=VAR_FLOOR).rsqrt().unsqueeze(-1)


@estimator("raw")
def raw_reward(rewards: torch.Tensor) -> torch.Tensor:
    """A = r: the raw verifiable reward used as advantage (Section 2.4, "raw reward")."""
    return rewards.clone()


@estimator("mean")
def mean_shifted(rewards: torch.Tensor) -> torch.Tensor:
    """A = r - mean_G(r): the group-mean baseline (Section 2.4, "mean-shifted")."""
    return rewards - rewards.mean(dim=-1, keepdim=True)


@estimator("grpo", "norm")
def grpo_normalized(rewards: torch.Tensor) -> torch.Tensor:
    """A = (r - mean_G(r)) / (std_G(r) + eps): GRPO's normalized advantage (Section 2.4, Theorem 2.3).

    ``std`` is the unbiased sample standard deviation (Bessel's correction), as GRPO's reference implementations
    in verl (``torch.std``) and OpenRLHF (``group_norm``); Theorem 2.3 calls it the empirical standard deviation.
    """
    centered = mean_shifted(rewards)
    std = rewards.std(dim=-1, keepdim=True, correction=1) if rewards.shape[-1] > 1 else 0.0
    return centered / (std + EPS)


@estimator("rloo")
def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """A_s = r_s - (sum_{j != s} r_j) / (G - 1): the leave-one-out baseline (Kool et al., 2019; OpenRLHF ``rloo``)."""
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError("RLOO needs a group size G >= 2")
    total = rewards.sum(dim=-1, keepdim=True)
    return rewards - (total - rewards) / (g - 1)


@estimator("rpp", batch=whiten)
def reinforce_pp_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """Reinforce++ with baseline (Hu et al.): the group mean subtracted here, the batch whitened over its tokens
    after IAC (:func:`whiten`; a trainer passes each response's token count as ``weights``)."""
    return mean_shifted(rewards)


@estimator("drgrpo")
def drgrpo(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al., 2025): the group-mean baseline without the std division. Its other half, token sums
    over a constant instead of per-response means, is a loss aggregation (``calibrl.algo.losses``)."""
    return mean_shifted(rewards)


def iac_factor(advantages: torch.Tensor, alpha: float, successes: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse-success factor (G - |S+|)^alpha of each group (Algorithm 1, lines 11-14).

    ``|S+|`` is the group's success count (Section 3.1, Algorithm 1 line 12; Theorem 2.3's S+ is "the sampled
    correct modes"): the number of ``successes`` (bool, same shape as ``advantages``: the verifiable correctness of
    each response). Without ``successes`` it is the number of positive advantages, Algorithm 1 line 11's
    ``S+ = {s : A_s > 0}``: with binary rewards and a group baseline the two agree in every group with both
    outcomes (A > 0 exactly for the correct samples), and in a group without both every A is 0, so nothing is
    scaled under either reading. They differ for shaped rewards (DAPO's overlong penalty): a correct but overlong
    response can fall below its group's mean, and it is still a success. The trainers therefore always pass the
    correctness (the CPU trainer its graded ``correct``, OpenRLHF's patch the reward file's 0/1 ``scores``), never
    the reward. ``0 ** 0 == 1``, so alpha = 0 gives a factor of exactly 1 everywhere.
    """
    import torch

    if alpha < 0:
        raise ValueError(f"IAC alpha must be >= 0 (Section 3.1), got {alpha}")
    g = advantages.shape[-1]
    counted = advantages > 0 if successes is None else _successes(successes, advantages)
    n_pos = counted.sum(dim=-1, keepdim=True).to(advantages.dtype)
    return torch.pow(g - n_pos, alpha)


def _successes(successes: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    if successes.shape != advantages.shape:
        raise ValueError(f"IAC successes of shape {tuple(successes.shape)} for advantages {tuple(advantages.shape)}")
    return successes.to(advantages.device).bool()


def iac(advantages: torch.Tensor, alpha: float, successes: torch.Tensor | None = None) -> torch.Tensor:
    """IAC (Section 3.1, Algorithm 1 lines 11-18): ``A~(q, o+) = A(q, o+) * (G - |S+|)^alpha`` for every positive
    sample, negative and zero advantages unchanged. ``successes`` (bool, same shape): the correct responses, which
    both count in ``|S+|`` (:func:`iac_factor`) and are the positive samples; a success is scaled where its
    advantage is positive, since "we only calibrate the advantages of positive samples" and "by not amplifying
    negative samples, we avoid collapsing on partially correct or truncated trajectories" (Section 3.1): a correct
    response that DAPO's overlong penalty put below its group's mean counts as a success but keeps its negative
    advantage, and a wrong one above the mean (possible only with shaped rewards) is not scaled. Without
    ``successes``, the positive advantages (exact for binary rewards; see :func:`iac_factor`). ``alpha == 0``
    returns the input bit for bit."""
    import torch

    if alpha < 0:
        raise ValueError(f"IAC alpha must be >= 0 (Section 3.1), got {alpha}")
    if alpha == 0:
        return advantages.clone()
    positive = advantages > 0
    if successes is not None:
        positive = positive & _successes(successes, advantages)
    return torch.where(positive, advantages * iac_factor(advantages, alpha, successes), advantages)


def advantages(
    rewards: torch.Tensor,
    estimator: str,
    iac_alpha: float = 0.0,
    weights: torch.Tensor | None = None,
    successes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Estimator ``estimator`` of ``rewards`` (..., groups, G) with IAC at ``iac_alpha`` (0: uncalibrated) on its
    group advantages, before its batch transform (``weights``: see :func:`whiten`; ``successes``: the correctness
    IAC counts, see :func:`iac`). OpenRLHF's code has the same order (``calibrl.backends.openrlhf.iac``: IAC on the
    group advantages, then OpenRLHF whitens)."""
    import torch

    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    est = ESTIMATORS[estimator]
    calibrated = iac(est.group(rewards), iac_alpha, successes)
    if est.batch is None:
        return calibrated
    return est.batch(calibrated) if weights is None else est.batch(calibrated, weights)
