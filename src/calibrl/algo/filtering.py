"""Table 5's filtering baseline: drop the easiest share of the training queries (Appendix I).

"A simple filtering-based baseline that discards the easiest 25% of training queries according to their
empirical success rate": the rate of each query is measured once, with ``filter_samples`` samples from
the initial policy, before training. The CPU trainer measures it in-process; at paper scale the
``rank_train`` rule measures it with vLLM. Both select with ``keep_indices``.
"""

from __future__ import annotations

from collections.abc import Sequence


def keep_indices(rates: Sequence[float], share: float) -> list[int]:
    """Indices kept after dropping the ``round(share * len(rates))`` highest success rates.

    Ties are broken by position (earlier rows are dropped first), so the selection is deterministic.
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"filter_easiest must be in [0, 1), got {share}")
    order = sorted(range(len(rates)), key=lambda i: (-rates[i], i))
    dropped = set(order[: int(round(share * len(rates)))])
    return [i for i in range(len(rates)) if i not in dropped]


def summary(rates: Sequence[float], kept: Sequence[int]) -> dict:
    """What the filter did, for the run's record."""
    kept_rates = [rates[i] for i in kept]
    return {
        "filter_dropped": len(rates) - len(kept),
        "filter_kept_mean_success": sum(kept_rates) / max(len(kept_rates), 1),
        "filter_all_mean_success": sum(rates) / max(len(rates), 1),
    }
