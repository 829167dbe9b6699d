"""DAPO's reward shaping and dynamic sampling (Yu et al., 2025; verl's DAPO recipe).

The sampling loop (generation batches until ``prompts_per_step`` groups pass the filter, trimmed to that many)
is the CPU trainer's ``_collect``. Its other parts are settings of the shared formulas: clip-higher and dual clip
(``losses.policy_loss``), token-mean aggregation (``losses.AGGREGATIONS``), no KL term (``calibrl.spec``).
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    """The soft overlong punishment added to the reward: 0 up to ``max_len - cache`` tokens, then linear down to
    -1 at ``max_len`` (DAPO Eq. 13; verl's ``overlong_buffer`` with ``penalty_factor`` 1)."""
    start = max_len - cache
    return ((start - lengths.float()) / cache).clamp(min=-1.0, max=0.0)


def informative_groups(values: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling's filter: of ``values`` (groups, G), the groups whose G values are not all equal (all
    correct or all wrong groups carry no group-relative signal). (groups,) bool. The trainers pass the accuracy,
    as verl's recipe (``filter_groups.metric: acc``) and OpenRLHF (its 0/1 scores) filter, not shaped rewards."""
    return values.max(dim=-1).values > values.min(dim=-1).values
