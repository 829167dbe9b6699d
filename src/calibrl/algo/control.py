"""The control arm of the over-sharpening claims: RL whose rewards carry no information about the response.

Over-sharpening (Definition 2.1: a correct mode's probability falls relative to the reference) is measured against
the base model, and any 50 steps of updates move modes, correct or not: between two training seeds of one method a
correct mode halves on about 42% of problems. A claim that *RL with verifiable rewards* over-sharpens therefore
needs a comparator that trains as much with rewards that say nothing about correctness: the step's rewards (and
the correctness each one came with) permuted across all of its responses. The batch keeps its reward distribution,
so the advantages, the clipping and the optimizer's steps have the same sizes; only their link to the response is
cut. Not in the paper: the miniature's analysis plan uses it as P5's comparator.
"""

from __future__ import annotations

import torch


def shuffled(rewards: torch.Tensor, correct: torch.Tensor, generator: torch.Generator):
    """``(rewards, correct)`` of one step's (B,) responses under one random permutation drawn from ``generator``
    (the pairs stay together: IAC's success counts follow the reward they came with)."""
    order = torch.randperm(len(rewards), generator=generator, device=rewards.device)
    return rewards[order], correct[order]
