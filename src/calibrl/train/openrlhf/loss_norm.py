"""Dr. GRPO's constant loss normaliser inside OpenRLHF 0.11.2, which offers only ``token-mean`` and
``seq-mean-token-mean`` (``--actor.loss_agg_mode``, train_ppo_ray.py L440-447).

Dr. GRPO (and verl's ``seq-mean-token-sum-norm``, its Dr. GRPO recipe) divides each response's summed token
losses by one constant, the generation budget L, instead of by the response's own length:
``loss = sum_i sum_t l_it / (B L)`` over the B responses of a step, as ``calibrl.train.local.aggregate`` does on
CPU. OpenRLHF's ``aggregate_loss`` (``openrlhf/models/loss.py`` L11-39) in token mode returns
``sum l * mask / batch_num_tokens * dp_size``, where ``batch_num_tokens`` and ``global_batch_size`` are the
step's totals over every micro-batch and data-parallel rank, divided by the gradient-accumulation steps
(``utils/loss_utils.py``); replacing ``batch_num_tokens`` by ``global_batch_size x L`` therefore gives the
constant normaliser over the whole step, with OpenRLHF's own dp and accumulation bookkeeping.

``patch(module)`` wraps ``aggregate_loss`` of ``openrlhf.models.loss``, the name ``PolicyLoss.forward`` looks up
(the KL and entropy terms of ``ppo_actor`` import their own reference and keep token-mean). Installed by the
setup hook (``iac_patch.apply``) in every Ray worker when ``CALIBRL_LOSS_NORM_LEN`` is set; the command sets it
with ``--calibrl.loss_norm_len`` for ``loss_agg: seq-mean-token-sum-norm``.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

ENV = "CALIBRL_LOSS_NORM_LEN"
MODULE = "openrlhf.models.loss"


def norm_len() -> int:
    """L from ``CALIBRL_LOSS_NORM_LEN`` (unset or empty: 0, OpenRLHF's own aggregation)."""
    raw = os.environ.get(ENV, "").strip()
    value = int(raw) if raw else 0
    if value < 0:
        raise ValueError(f"{ENV} must be a token count >= 1, got {raw!r}")
    return value


def patch(module: ModuleType) -> None:
    """Make ``module.aggregate_loss``'s token mode divide by ``global_batch_size x L`` (once)."""
    length = norm_len()
    original = getattr(module, "aggregate_loss", None)
    if original is None:
        raise RuntimeError(
            f"{module.__name__} has no aggregate_loss: OpenRLHF changed, Dr. GRPO's normaliser cannot go in"
        )
    if length == 0 or getattr(original, "_calibrl_norm_len", None):
        return

    @functools.wraps(original)
    def aggregate_loss(
        loss, loss_mask, token_level_loss=True, dp_size=1, batch_num_tokens=None, global_batch_size=None
    ):
        if not token_level_loss:
            raise RuntimeError("Dr. GRPO's normaliser needs --actor.loss_agg_mode token-mean (command.py sets it)")
        if global_batch_size is None:  # no step totals given: this micro-batch's responses
            global_batch_size = (loss_mask.reshape(loss_mask.shape[0], -1).sum(-1) > 0).sum().clamp(min=1)
        return (loss * loss_mask).sum() / (global_batch_size * length) * dp_size

    aggregate_loss._calibrl_norm_len = length
    module.aggregate_loss = aggregate_loss
