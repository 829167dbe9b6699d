"""Dr. GRPO's constant loss normaliser in OpenRLHF 0.11.2's policy loss, which offers only ``token-mean`` and
``seq-mean-token-mean`` (``--actor.loss_agg_mode``).

The formula is ``calibrl.algo.losses.seq_mean_token_sum_norm``: each response's summed token losses over one
constant, the generation budget L, ``sum_i sum_t l_it / (B L)`` over the B responses of a step. OpenRLHF's
``aggregate_loss`` in token mode returns ``sum(l * mask) / batch_num_tokens * dp_size``, where
``batch_num_tokens`` and ``global_batch_size`` are the step's totals over every micro-batch and data-parallel rank
divided by the gradient-accumulation steps (``openrlhf.utils.loss_utils``); with ``global_batch_size`` as B the
formula keeps OpenRLHF's own data-parallel and accumulation bookkeeping.

Only the policy loss takes it. ``PolicyLoss.forward`` looks ``aggregate_loss`` up in ``openrlhf.models.loss`` at
call time; ``openrlhf.models`` re-exports the name and ``trainer/ray/ppo_actor.py`` imports that re-export for its
KL loss and its logged entropy. The patch is applied once ``openrlhf.models`` has bound the original, so the KL term
and the entropy stay token means (the entropy is compared across methods in the figures; the KL keeps the GRPO
recipe's aggregation), as ``tests/test_openrlhf.py`` checks on OpenRLHF's own modules. (verl's Dr. GRPO
aggregates its KL and entropy terms the same way as the policy loss; its Dr. GRPO example has neither.)
"""

from __future__ import annotations

import functools
import logging
import sys
from types import ModuleType

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.loss_norm")

PACKAGE = "openrlhf.models"
AGGREGATE = Target(
    "openrlhf.models.loss",
    "aggregate_loss",
    params=("loss", "loss_mask", "token_level_loss", "dp_size", "batch_num_tokens", "global_batch_size"),
)
TARGETS = (AGGREGATE,)


def install(length: int) -> None:
    """Divide the policy loss's token sums by (responses x ``length``) once ``openrlhf.models`` is imported."""
    if length < 1:
        raise ValueError(f"Dr. GRPO's normaliser needs a token budget >= 1, got {length}")
    when_imported(PACKAGE, functools.partial(patch, length=length))


def patch(package: ModuleType, length: int) -> None:
    """Wrap ``openrlhf.models.loss.aggregate_loss`` (after ``package``, ``openrlhf.models``, bound the original)."""
    from calibrl.algo.losses import seq_mean_token_sum_norm

    def make(original):
        def aggregate_loss(
            loss, loss_mask, token_level_loss=True, dp_size=1, batch_num_tokens=None, global_batch_size=None
        ):
            if not token_level_loss:
                raise RuntimeError("Dr. GRPO's normaliser needs --actor.loss_agg_mode token-mean (command.py sets it)")
            if global_batch_size is None:  # no step totals given: this micro-batch's responses
                global_batch_size = (loss_mask.reshape(loss_mask.shape[0], -1).sum(-1) > 0).sum().clamp(min=1)
            return seq_mean_token_sum_norm(loss, loss_mask, length, sequences=global_batch_size) * dp_size

        return aggregate_loss

    if AGGREGATE.wrap(sys.modules[AGGREGATE.module], "loss_norm", make):
        log.info("Dr. GRPO's constant normaliser (L = %d) installed on %s", length, AGGREGATE)
