"""Paired hierarchical bootstrap over training seeds, then evaluation problems; Holm; three-way verdicts.

Design (fixed before looking at results):
- Every arm of a comparison is trained with the same seeds (same data order, same evaluation samples: common
  random numbers) and evaluated on the same problems, so arms are *paired* on seeds and on problems.
- One bootstrap replicate draws S seeds with replacement, then the problems with replacement within each
  evaluation split. Problems are crossed with seeds (every seed is evaluated on the same problems), so one
  problem draw serves every seed and every arm of the replicate; the pairing is kept at both levels.
- The bootstrap's seed-level variance is shrunk by (S - 1) / S; the standard error is scaled back by
  sqrt(S / (S - 1)) and the interval and p-value use Student's t with S - 1 degrees of freedom, so a handful of
  seeds gives wide, honest intervals (checked by the calibration test in tests/test_claims.py).
- A claim's p-value is two-sided; Holm's step-down procedure controls the family-wise error across the claims.
  ``holds``: significant after Holm in the claimed direction; ``contradicted``: significant in the opposite
  direction; ``inconclusive``: neither, or fewer than two paired seeds (no seed variance to test against).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

LEVEL = 0.05  # family-wise error rate of the verdicts (Holm)
REPS = 2000  # bootstrap replicates per claim


@dataclass
class Sample:
    """Arms on common seeds and problems: ``values[arm]`` has shape (seeds, problems).

    ``weights`` (problems,) sum to 1 (each split weighs equally, as the paper's Avg. column: the mean of its
    benchmarks); ``strata`` (problems,) is the split of each problem, resampled within."""

    values: dict[str, np.ndarray]
    weights: np.ndarray
    strata: np.ndarray
    seeds: list[int]

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)


@dataclass
class Estimate:
    estimate: float
    se: float
    ci_low: float
    ci_high: float
    p: float  # two-sided, unadjusted
    seeds: int


def _problem_counts(strata: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps, problems) multiplicities of one bootstrap draw of problems within each stratum."""
    counts = np.zeros((reps, len(strata)))
    for s in np.unique(strata):
        where = np.flatnonzero(strata == s)
        counts[:, where] = rng.multinomial(len(where), np.full(len(where), 1 / len(where)), size=reps)
    return counts


def residual_var(d: np.ndarray) -> float:
    """Seed x problem interaction variance of ``d`` (seeds, problems): the two-way residual mean square."""
    s, p = d.shape
    if s < 2 or p < 2:
        return 0.0
    resid = d - d.mean(axis=1, keepdims=True) - d.mean(axis=0, keepdims=True) + d.mean()
    return float((resid**2).sum() / ((s - 1) * (p - 1)))


def bootstrap(
    sample: Sample,
    contrast: Callable[[dict[str, np.ndarray]], np.ndarray],
    reps: int = REPS,
    seed: int = 0,
    linear: bool = True,
) -> Estimate:
    """The ``contrast`` of the arms' means (e.g. ``lambda m: m["iac"] - m["grpo"]``), with its interval.

    ``contrast`` maps {arm: array of means} to an array of the same shape; it is applied to the point estimate
    and to every replicate, so non-linear claims (the best of several, an interior optimum) are handled alike.

    Resampling seeds and problems of a crossed design counts the seed x problem noise (mostly evaluation
    sampling) three times instead of once (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat.); for a
    ``linear`` contrast (differences of arms, applied per problem) the excess is estimated from the two-way
    residual and removed; a non-linear contrast keeps the conservative variance."""
    rng = np.random.default_rng(seed)
    s = sample.n_seeds
    point = float(contrast({a: np.array([(v @ sample.weights).mean()]) for a, v in sample.values.items()})[0])
    if s < 2:
        return Estimate(point, float("nan"), float("nan"), float("nan"), float("nan"), s)
    pick = rng.integers(0, s, size=(reps, s))
    w = _problem_counts(sample.strata, reps, rng) * sample.weights  # (reps, problems)
    means = {}
    for arm, v in sample.values.items():
        per_seed = w @ v.T  # (reps, seeds): each seed's quantity under the replicate's problem draw
        means[arm] = np.take_along_axis(per_seed, pick, axis=1).mean(axis=1)
    draws = contrast(means)
    var = float(draws.var(ddof=1))
    if linear:
        d = contrast(sample.values)  # per seed and problem
        excess = 2 * residual_var(d) * float((sample.weights**2).sum()) / s
        var = max(var - excess, var / 3)  # never below the pigeonhole variance's floor
    se = float(np.sqrt(var * s / (s - 1)))
    t = st.t(df=s - 1)
    half = float(t.ppf(1 - LEVEL / 2) * se)
    p = 1.0 if se == 0 and point == 0 else (0.0 if se == 0 else float(2 * t.sf(abs(point) / se)))
    return Estimate(point, se, point - half, point + half, p, s)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone); NaN (untested) stays NaN and does not count."""
    p = np.asarray(pvalues, dtype=float)
    tested = np.flatnonzero(~np.isnan(p))
    out = np.full(len(p), np.nan)
    m = len(tested)
    running = 0.0
    for rank, i in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def verdict(estimate: float, p_adjusted: float, direction: int = 1, min_effect: float = 0.0) -> str:
    """holds / contradicted / inconclusive for a claim that the estimate has the sign ``direction``.

    ``min_effect``: a significant effect smaller than this (in the estimate's units) is inconclusive."""
    if not np.isfinite(p_adjusted) or p_adjusted >= LEVEL or abs(estimate) < min_effect:
        return "inconclusive"
    return "holds" if estimate * direction > 0 else "contradicted"
