"""Paired tests on per-seed differences, equivalence (TOST), Holm, five-way verdicts: the decision function.

Design (fixed before the data, ``calibrl.analysis_plan``):
- The unit of replication is the training seed. Every arm of a comparison is trained with the same seeds (same
  data order) and each seed's checkpoints are evaluated with that seed's own sampling stream (common random
  numbers across arms, independent across seeds), on the same problems. A seed's quantity is its mean over
  the problems (each split weighing equally, as the paper's Avg. column), so a paired difference D_s per seed
  holds every source of noise that replicates (training, evaluation sampling, their interaction with problems)
  exactly once. Inference is conditional on the evaluation problems, as the paper's benchmarks are fixed.
- Test: Student's t on the D_s with S - 1 degrees of freedom, two-sided. Where the D_s have no variance (all
  equal) the t statistic is undefined and the exact sign-flip test decides instead (p = 2 / 2^S when every
  difference has the same sign, 1 when all are zero): a zero standard error is never p = 0.
- Equivalence: two one-sided t tests (TOST) against +-margin; the larger p is the equivalence p-value.
- Holm's step-down over a family (the plan's primary claims), separately for the difference and the
  equivalence p-values. Verdicts (Lakens' four outcomes of the two tests, the first split by direction):
  ``holds`` (different from zero in the claimed direction and not shown smaller than the margin),
  ``contradicted`` (the same, the other way), ``negligible`` (different from zero, yet equivalent within the
  margin: an effect smaller than the plan's smallest effect of interest, in either direction), ``absent`` (not
  different, and equivalent within the margin), ``inconclusive`` (neither test decides).
- :func:`decide` is the whole decision function over a family; ``tests/test_calibration.py`` calibrates it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy import stats as st

LEVEL = 0.05  # family-wise error rate of the verdicts (Holm)
VERDICTS = ("holds", "contradicted", "negligible", "absent", "inconclusive")
EXACT_UP_TO = 16  # seeds up to which the sign-flip test enumerates every flip (2^16); Monte Carlo beyond


@dataclass
class Sample:
    """Arms on common seeds and problems: ``values[arm]`` has shape (seeds, problems); ``weights`` (problems,)
    sum to 1 (each split weighs equally); ``strata`` (problems,) the split of each problem."""

    values: dict[str, np.ndarray]
    weights: np.ndarray
    strata: np.ndarray
    seeds: list[int]

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    def per_seed(self, arm: str) -> np.ndarray:
        """(seeds,): each seed's quantity, the weighted mean over problems."""
        return self.values[arm] @ self.weights


@dataclass
class Estimate:
    estimate: float
    se: float
    ci_low: float
    ci_high: float
    p: float  # two-sided, unadjusted
    seeds: int
    p_equiv: float = float("nan")  # TOST against +-margin, unadjusted
    margin: float = float("nan")


def signflip_p(d: np.ndarray, reps: int = 20000, seed: int = 0) -> float:
    """Two-sided exact sign-flip p-value of the mean of ``d`` (Monte Carlo with ``reps`` flips past
    ``EXACT_UP_TO`` values): the share of sign assignments whose |mean| reaches the observed one."""
    d = np.asarray(d, dtype=float)
    if len(d) == 0:
        return float("nan")
    if len(d) <= EXACT_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(reps, len(d)))
        signs[0] = 1.0  # the observed assignment is one of them
    stat = np.abs(signs @ d)
    return float(np.mean(stat >= abs(d.sum()) * (1 - 1e-12)))


def paired(d: np.ndarray, margin: float = float("nan"), level: float = LEVEL) -> Estimate:
    """The mean of the per-seed differences ``d`` with its t interval, two-sided p and TOST p against ``margin``."""
    d = np.asarray(d, dtype=float)
    s = len(d)
    est = float(d.mean()) if s else float("nan")
    if s < 2:
        return Estimate(est, float("nan"), float("nan"), float("nan"), float("nan"), s, margin=margin)
    se = float(d.std(ddof=1) / np.sqrt(s))
    df = s - 1  # Student's t through scipy.special's ufuncs: the same values as scipy.stats.t, 100x faster
    half = float(special.stdtrit(df, 1 - level / 2) * se)
    if se > 0:
        p = float(2 * special.stdtr(df, -abs(est) / se))
        p_eq = (
            float(max(special.stdtr(df, -(est + margin) / se), special.stdtr(df, (est - margin) / se)))
            if np.isfinite(margin)
            else np.nan
        )
    else:  # no variance: the exact sign-flip test; for equivalence, the one-sided sign tests (every d inside)
        p = signflip_p(d)
        p_eq = (0.5**s if abs(est) < margin else 1.0) if np.isfinite(margin) else float("nan")  # sign test
    return Estimate(est, se, est - half, est + half, p, s, p_eq, margin)


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


def verdict(estimate: float, p: float, p_equiv: float = float("nan"), direction: int = 1, level: float = LEVEL) -> str:
    """One of :data:`VERDICTS` for a claim that the estimate has the sign ``direction``, from the (adjusted)
    difference p-value and equivalence p-value."""
    different = bool(np.isfinite(p) and p < level)
    equivalent = bool(np.isfinite(p_equiv) and p_equiv < level)
    if different and equivalent:
        return "negligible"
    if different:
        return "holds" if estimate * direction > 0 else "contradicted"
    return "absent" if equivalent else "inconclusive"


def against_margin(e: Estimate, direction: int, level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, p): the estimate's (1 - 2 ``level``) interval, the one TOST reads (inside +-margin: equivalent at
    ``level``), and the one-sided p that the effect in the claimed ``direction`` exceeds the margin (the minimum-effect
    test: small when the effect is shown at least as large as the smallest effect that matters). Unadjusted."""
    nan = float("nan")
    if not (e.seeds >= 2 and e.se > 0 and np.isfinite(e.margin)):
        return nan, nan, nan
    df = e.seeds - 1
    half = float(special.stdtrit(df, 1 - level) * e.se)
    p_min = float(special.stdtr(df, -(e.estimate * direction - e.margin) / e.se))
    return e.estimate - half, e.estimate + half, p_min


def reading(verdict: str, e: Estimate | None, direction: int, level: float = LEVEL) -> str:
    """The verdict with what its interval says beside it: whether a difference found is below the margin (its
    (1 - 2 ``level``) interval inside +-margin) or shown at least as large, and which way a negligible one goes, so
    that "holds" never hides an effect shown smaller than the plan's smallest effect."""
    if e is None or not np.isfinite(e.estimate):
        return verdict
    low, high, p_min = against_margin(e, direction, level)
    side = "in the claimed direction" if e.estimate * direction > 0 else "against the claim"
    if verdict == "holds":
        if np.isfinite(low) and -e.margin < low and high < e.margin:
            return "holds (below the margin)"
        return "holds (at least the margin)" if p_min < level else "holds (size unresolved)"
    if verdict == "negligible":
        return f"negligible ({side})"
    return verdict


@dataclass
class Decision:
    """A family's decisions, one entry per claim (``None`` where a claim has no data: ``inconclusive``)."""

    estimates: list[Estimate | None]
    p_holm: list[float]
    p_equiv_holm: list[float]
    verdicts: list[str]


def decide(
    diffs: list[np.ndarray | None], margins: list[float], directions: list[int], level: float = LEVEL
) -> Decision:
    """The decision function over a family of claims: each claim's paired test and TOST on its per-seed
    differences, Holm over the family for each, then the verdicts."""
    estimates = [None if d is None else paired(d, m, level) for d, m in zip(diffs, margins)]
    nan = float("nan")
    p_holm = holm([nan if e is None else e.p for e in estimates])
    p_eq_holm = holm([nan if e is None else e.p_equiv for e in estimates])
    verdicts = [
        verdict(nan if e is None else e.estimate, p, q, direction, level)
        for e, p, q, direction in zip(estimates, p_holm, p_eq_holm, directions)
    ]
    return Decision(estimates, p_holm, p_eq_holm, verdicts)


def power(sd: float, effect: float, seeds: int, level: float = LEVEL) -> float:
    """Power of the two-sided paired t test at ``level`` for a true mean difference ``effect`` when the per-seed
    differences have standard deviation ``sd`` (the noncentral t distribution)."""
    if seeds < 2 or sd <= 0:
        return float("nan")
    df, nc = seeds - 1, effect / (sd / np.sqrt(seeds))
    crit = st.t.ppf(1 - level / 2, df)
    exact = float(st.nct.sf(crit, df, nc) + st.nct.cdf(-crit, df, nc))
    # scipy's noncentral t gives NaN far in the tail (a large noncentrality): the normal limit is exact enough there
    return exact if np.isfinite(exact) else float(st.norm.sf(crit - nc) + st.norm.cdf(-crit - nc))


def seeds_needed(sd: float, effect: float, target: float = 0.8, level: float = LEVEL, most: int = 1000) -> int:
    """The fewest paired seeds at which :func:`power` reaches ``target`` (``most`` + 1 if none up to ``most``)."""
    for s in range(2, most + 1):
        if power(sd, effect, s, level) >= target:
            return s
    return most + 1
