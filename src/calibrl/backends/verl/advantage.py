"""The project's advantage estimators in verl 0.9.1, and IAC between verl's group stage and its batch stage.

Without IAC (alpha = 0) a method runs verl's own estimator (:data:`ESTIMATORS`: ``algorithm.adv_estimator`` and
``algorithm.norm_adv_by_std_in_grpo``): GRPO ``grpo``; Dr. GRPO ``grpo`` without the std division (its token-sum
aggregation is the actor's ``loss_agg_mode: seq-mean-token-sum-norm`` with ``loss_scale_factor`` the generation
budget); RLOO ``rloo``; Reinforce++-baseline ``reinforce_plus_plus_baseline``. ``tests/test_verl_parity.py`` checks
each against ``calibrl.algo.advantages`` on one batch (and reports where they differ: verl whitens Reinforce++ with
Bessel's correction).

With IAC (alpha > 0) a method runs the estimator this module registers with verl's ``register_adv_est``
(:func:`register`; :data:`IAC_ESTIMATORS`: ``calibrl_iac_<estimator>``). Each one is verl's estimator cut at its
group stage (Algorithm 1 lines 11-18):

1. the group advantages are verl's own function's: ``compute_grpo_outcome_advantage`` (with the std division for
   GRPO, without for Dr. GRPO and for Reinforce++'s group mean, which is the same code as the group part of
   ``compute_reinforce_plus_plus_baseline_outcome_advantage``) or ``compute_rloo_outcome_advantage``, called on one
   column (each response's summed token-level reward, as verl sums it) so that its output is one value a response;
2. ``calibrl.algo.advantages.iac`` calibrates them group by group, the groups being the rows of equal ``index``
   (verl's ``uid``, grouped as verl groups them: by equal value, in any row order), its successes the responses'
   *correctness* (:func:`successes`), not their reward: DAPO's reward is +1 / -1 plus the overlong penalty, and a
   correct but overlong response can sit below its group's mean;
3. the calibrated advantage is spread over the response's tokens (``* response_mask``), and for Reinforce++ whitened
   over the batch's tokens with verl's ``masked_whiten``, as verl's estimator does after its group mean.

At alpha = 0 each registered estimator returns verl's own estimator's output (the test checks it), so IAC's
estimators differ from the baselines' by the calibration only.

Settings. The estimator reads alpha from :func:`install` (the trainer process's setup calls it with the run's
``iac_alpha``), else from the environment variable :data:`ALPHA_ENV` (so a Ray actor started with the run's
environment has it without a call), else raises. It reads the correctness from :func:`successes`, a context the
trainer sets around verl's advantage computation with the batch's ``acc`` in the batch's row order *at that point*
(after any reordering, e.g. verl's ``balance_batch``); with alpha > 0 and no context it raises, naming it.

Only the standard library and ``calibrl`` are imported here at module level: ``import
calibrl.backends.verl.advantage`` works in a venv without verl (or torch); verl and torch are imported where an
estimator runs or :func:`register` is called.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calibrl.algo.advantages import iac

if TYPE_CHECKING:
    import torch

ALPHA_ENV = "CALIBRL_IAC_ALPHA"
"""The environment variable an estimator reads IAC's alpha from when :func:`install` was not called."""


@dataclass(frozen=True)
class VerlEstimator:
    """How a project estimator runs in verl."""

    adv_estimator: str
    """verl's ``algorithm.adv_estimator`` without IAC."""
    norm_adv_by_std_in_grpo: bool
    """verl's ``algorithm.norm_adv_by_std_in_grpo`` (read by verl's ``grpo`` only; the IAC estimators of ``grpo``
    and ``drgrpo`` check it agrees)."""
    iac_name: str
    """The ``algorithm.adv_estimator`` with IAC, registered by :func:`register`."""
    group_stage: str
    """verl's group-stage function the IAC estimator calls (``verl.trainer.ppo.core_algos``)."""
    group_norm: bool | None
    """``norm_adv_by_std_in_grpo`` of that call (None: the function has no such argument)."""
    whiten: bool
    """Whitened over the batch's tokens after IAC (``verl.utils.torch_functional.masked_whiten``)."""


ESTIMATORS: dict[str, VerlEstimator] = {
    "grpo": VerlEstimator("grpo", True, "calibrl_iac_grpo", "compute_grpo_outcome_advantage", True, False),
    "drgrpo": VerlEstimator("grpo", False, "calibrl_iac_drgrpo", "compute_grpo_outcome_advantage", False, False),
    "rloo": VerlEstimator("rloo", True, "calibrl_iac_rloo", "compute_rloo_outcome_advantage", None, False),
    "rpp": VerlEstimator(
        "reinforce_plus_plus_baseline", True, "calibrl_iac_rpp", "compute_grpo_outcome_advantage", False, True
    ),
}
"""Project estimator (``calibrl.algo.advantages.ESTIMATORS``) -> how verl runs it. The toy's ``raw`` and ``mean``
have no verl counterpart (the paper-scale methods use these four)."""

PLAIN: dict[str, tuple[str, bool]] = {k: (v.adv_estimator, v.norm_adv_by_std_in_grpo) for k, v in ESTIMATORS.items()}
"""Project estimator -> (verl's ``algorithm.adv_estimator``, ``algorithm.norm_adv_by_std_in_grpo``) without IAC."""

IAC_ESTIMATORS: dict[str, str] = {k: v.iac_name for k, v in ESTIMATORS.items()}
"""Project estimator -> the name of its IAC estimator in verl's registry (:func:`register`)."""


def algorithm_overrides(estimator: str, iac_alpha: float) -> dict[str, Any]:
    """verl's ``algorithm.*`` settings of a method: ``adv_estimator`` (the IAC estimator where ``iac_alpha > 0``)
    and ``norm_adv_by_std_in_grpo``."""
    spec = _spec(estimator)
    if iac_alpha < 0:
        raise ValueError(f"IAC alpha must be >= 0 (Section 3.1), got {iac_alpha}")
    name = spec.iac_name if iac_alpha > 0 else spec.adv_estimator
    return {"adv_estimator": name, "norm_adv_by_std_in_grpo": spec.norm_adv_by_std_in_grpo}


def _spec(estimator: str) -> VerlEstimator:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator {estimator!r} has no verl counterpart; the verl backend runs {sorted(ESTIMATORS)}")
    return ESTIMATORS[estimator]


# ------------------------------------------------------------------------------------------- settings
_alpha: float | None = None
_successes: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("calibrl_verl_successes", default=None)


def install(alpha: float) -> None:
    """Set IAC's alpha for this process's estimators (>= 0; it wins over :data:`ALPHA_ENV`)."""
    global _alpha
    alpha = float(alpha)
    if alpha < 0:
        raise ValueError(f"IAC alpha must be >= 0 (Section 3.1), got {alpha}")
    _alpha = alpha


def current_alpha() -> float:
    """IAC's alpha as the estimators read it: :func:`install`'s, else :data:`ALPHA_ENV`'s; raises if neither."""
    if _alpha is not None:
        return _alpha
    raw = os.environ.get(ALPHA_ENV)
    if raw is None or not raw.strip():
        raise RuntimeError(
            f"calibrl's IAC estimator has no alpha: call calibrl.backends.verl.advantage.install(alpha) in the "
            f"process that computes advantages, or set {ALPHA_ENV}"
        )
    alpha = float(raw)
    if alpha < 0:
        raise ValueError(f"{ALPHA_ENV}={raw!r}: IAC alpha must be >= 0 (Section 3.1)")
    return alpha


@contextlib.contextmanager
def successes(acc: Any) -> Iterator[torch.Tensor]:
    """The correctness of the batch's responses (bool or 0/1, one per row, in the batch's row order) for the IAC
    estimators called inside this context. Yields it as a bool tensor. Values other than 0/1 raise: a reward (DAPO's
    +1 / -1) passed by mistake would count every response a success."""
    import torch

    flags = torch.as_tensor(acc).detach().reshape(-1).cpu()
    if flags.dtype != torch.bool:
        values = flags.to(torch.float64)
        if not bool(((values == 0) | (values == 1)).all()):
            raise ValueError(
                f"IAC successes must be the correctness (bool or 0/1), got values {sorted(set(values.tolist()))[:6]}"
            )
        flags = values == 1
    token = _successes.set(flags)
    try:
        yield flags
    finally:
        _successes.reset(token)


def _current_successes(name: str, rows: int) -> torch.Tensor:
    flags = _successes.get()
    if flags is None:
        raise RuntimeError(
            f"{name}: IAC (alpha > 0) counts the successes of each group, and none were given: wrap verl's advantage "
            "computation in calibrl.backends.verl.advantage.successes(acc) (the responses' correctness, in row order)"
        )
    if flags.numel() != rows:
        raise ValueError(f"{name}: successes() holds {flags.numel()} responses for a batch of {rows}")
    return flags


# ------------------------------------------------------------------------------------------ estimators
def _estimate(
    project: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    epsilon: float = 1e-6,
    config: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    import verl.utils.torch_functional as verl_F
    from verl.trainer.ppo import core_algos

    spec = ESTIMATORS[project]
    if index is None:
        raise ValueError(f"{spec.iac_name}: verl passed no index (the batch has no 'uid'); IAC needs the groups")
    if spec.adv_estimator == "grpo" and config is not None:  # the flag means something for GRPO / Dr. GRPO only
        flag = config.get("norm_adv_by_std_in_grpo", None) if hasattr(config, "get") else None
        if flag is not None and bool(flag) != spec.norm_adv_by_std_in_grpo:
            raise ValueError(
                f"{spec.iac_name}: algorithm.norm_adv_by_std_in_grpo={flag} contradicts the estimator "
                f"{project!r} (set it to {spec.norm_adv_by_std_in_grpo})"
            )
    alpha = current_alpha()
    rows = token_level_rewards.shape[0]

    # 1. verl's group stage, on one column: each response's summed reward (the sum verl takes) -> (B,)
    scores = token_level_rewards.sum(dim=-1, keepdim=True)
    kwargs: dict[str, Any] = {"epsilon": epsilon, "config": config}
    if spec.group_norm is not None:
        kwargs["norm_adv_by_std_in_grpo"] = spec.group_norm
    group_stage = getattr(core_algos, spec.group_stage)
    group, _ = group_stage(token_level_rewards=scores, response_mask=torch.ones_like(scores), index=index, **kwargs)
    group = group.squeeze(-1)

    # 2. IAC per group (rows of equal index, as verl groups them), counting the correct responses
    if alpha > 0:
        acc = _current_successes(spec.iac_name, rows).to(group.device)
        calibrated = group.clone()
        for members in _groups(index).values():
            at = torch.tensor(members, device=group.device)
            calibrated[at] = iac(group[at], alpha, acc[at])
        group = calibrated

    # 3. over the tokens, then (Reinforce++) verl's whitening over the batch's tokens
    if not spec.whiten:
        adv = group.unsqueeze(-1) * response_mask
        return adv, adv
    adv = group.unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * response_mask
    adv = verl_F.masked_whiten(adv, response_mask) * response_mask
    return adv, adv


def _groups(index: Any) -> dict[Any, list[int]]:
    """Rows by group, as verl's estimators group them (``id2score[index[i]]``: equal values of ``index``)."""
    out: dict[Any, list[int]] = {}
    for i in range(len(index)):
        out.setdefault(index[i], []).append(i)
    return out


def iac_grpo(token_level_rewards, response_mask, index=None, epsilon=1e-6, config=None, **_):
    """GRPO with IAC (``calibrl_iac_grpo``)."""
    return _estimate("grpo", token_level_rewards, response_mask, index, epsilon, config)


def iac_drgrpo(token_level_rewards, response_mask, index=None, epsilon=1e-6, config=None, **_):
    """Dr. GRPO with IAC (``calibrl_iac_drgrpo``)."""
    return _estimate("drgrpo", token_level_rewards, response_mask, index, epsilon, config)


def iac_rloo(token_level_rewards, response_mask, index=None, epsilon=1e-6, config=None, **_):
    """RLOO with IAC (``calibrl_iac_rloo``)."""
    return _estimate("rloo", token_level_rewards, response_mask, index, epsilon, config)


def iac_rpp(token_level_rewards, response_mask, index=None, epsilon=1e-6, config=None, **_):
    """Reinforce++-baseline with IAC (``calibrl_iac_rpp``): verl's whitening after IAC."""
    return _estimate("rpp", token_level_rewards, response_mask, index, epsilon, config)


FUNCTIONS = {"grpo": iac_grpo, "drgrpo": iac_drgrpo, "rloo": iac_rloo, "rpp": iac_rpp}


def register() -> dict[str, str]:
    """Register the IAC estimators in verl's ``ADV_ESTIMATOR_REGISTRY`` (idempotent). Returns
    :data:`IAC_ESTIMATORS`."""
    from verl.trainer.ppo.core_algos import register_adv_est

    for project, fn in FUNCTIONS.items():
        register_adv_est(IAC_ESTIMATORS[project])(fn)
    return dict(IAC_ESTIMATORS)
