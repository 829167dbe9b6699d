"""DAPO's reward and dynamic sampling (Yu et al., 2025; verl's DAPO recipe).

DAPO's reward is signed: +1 for a correct response, -1 otherwise (verl ``verl/utils/reward_score/math_dapo.py``,
``compute_score``: ``reward = 1.0 if correct else -1.0``), plus the soft overlong penalty (verl
``verl/workers/reward_manager/dapo.py``, ``overlong_buffer_cfg``; the recipe's scripts: ``overlong_buffer.len``
4,096, ``penalty_factor`` 1.0, of ``max_response_length`` 20,480 in its Qwen2.5-32B script (DAPO's paper) and 8,192
in ``test_dapo_7b_math.sh``, the budget here). The other methods' reward is binary, 1 / 0 (:data:`REWARDS`;
``calibrl.spec.MethodSpec.reward`` names a run's). The penalty is on the recipe's scale only with the signed
reward: on 1 / 0 it would be twice as strong against the gap between a correct and a wrong response.

The sampling loop (generation batches until ``prompts_per_step`` groups pass the filter, trimmed to that many)
is the CPU trainer's ``_collect``. Its other parts are settings of the shared formulas: clip-higher and dual clip
(``losses.policy_loss``), token-mean aggregation (``losses.AGGREGATIONS``), no KL term (``calibrl.spec``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a formula runs: REWARDS and PENALTY_FACTOR read torch-free
    import torch

REWARDS: dict[str, tuple[float, float]] = {
    "binary": (1.0, 0.0),  # the verifiable reward of GRPO and the others (the paper's r in {0, 1})
    "signed": (1.0, -1.0),  # DAPO: verl's math_dapo.compute_score
}
"""Reward scales by name: (reward of a correct response, reward of a wrong one)."""

PENALTY_FACTOR = 1.0
"""The overlong penalty's largest magnitude (verl's ``overlong_buffer.penalty_factor`` in the DAPO recipe)."""


def outcome_reward(correct: torch.Tensor, kind: str) -> torch.Tensor:
    """The verifiable reward of responses whose correctness is ``correct`` (bool, any shape), on scale ``kind``
    (:data:`REWARDS`), as float32."""
    import torch

    if kind not in REWARDS:
        raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {kind!r}")
    right, wrong = REWARDS[kind]
    return torch.where(correct.bool(), right, wrong).to(torch.float32)


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int, factor: float = PENALTY_FACTOR) -> torch.Tensor:
    """The soft overlong punishment added to the reward: 0 up to ``max_len - cache`` tokens, then linear down to
    ``-factor`` at ``max_len`` (DAPO Eq. 13; verl's ``overlong_buffer`` with ``penalty_factor``; OpenRLHF 0.11.2's
    ``apply_overlong_penalty``, which caps the excess at the buffer as the clamp does here)."""
    start = max_len - cache
    return factor * ((start - lengths.float()) / cache).clamp(min=-1.0, max=0.0)


def reward(correct: torch.Tensor, lengths: torch.Tensor, kind: str, max_len: int, cache: int | None) -> torch.Tensor:
    """A response's reward as a trainer uses it: :func:`outcome_reward` on scale ``kind``, plus
    :func:`overlong_penalty` when ``cache`` (DAPO's overlong buffer in tokens) is set. DAPO (``signed``, cache
    4096 of 8192 tokens): a correct answer of 7168 tokens gets 1 - 0.75 = 0.25, a wrong one -1 - 0.75 = -1.75."""
    out = outcome_reward(correct, kind)
    if cache is not None:
        out = out + overlong_penalty(lengths, max_len, cache)
    return out


def informative_groups(values: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling's filter: of ``values`` (groups, G), the groups whose G values are not all equal (all
    correct or all wrong groups carry no group-relative signal). (groups,) bool. The trainers pass the accuracy,
    as verl's recipe (``filter_groups.metric: acc``) and OpenRLHF (its 0/1 scores) filter, not shaped rewards."""
    return values.max(dim=-1).values > values.min(dim=-1).values
