"""Measures of over-sharpening, per method, with 95% bands over seeds.

- pass@k for k = 1, 2, 4, .. n (the unbiased estimator from each problem's n samples) of the base model and the
  final checkpoints: a sharpened policy gains at k = 1 and loses at large k (Section 1: RLVR sharpens rather
  than extends);
- any per-problem metric (distinct correct answers, PASS@k) per checkpoint, with the base model (every arm's
  start) at step 0, evaluated with the same seeds' sampling streams;
- training entropy per step (Figure 6's quantity), smoothed over 5 steps.
Bands are t intervals over the per-seed values (the unit of replication, ``calibrl.stats``); with one seed a
band covers the problems only, and the legend says so. ``calibrl.report.figures`` draws them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as st

from calibrl import stats as S
from calibrl.analysis_plan import BASE
from calibrl.report.claims import problem_quantity, sample_of

COLUMNS = ["method", "x", "mean", "low", "high", "seeds"]


def _band(q: pd.DataFrame, model: str, method: str, weights=None) -> tuple[float, float, float, int]:
    """(mean, low, high, seeds) of one method's per-problem quantity ``q`` (``weights``: the splits', as
    ``sample_of``); one seed: problems only."""
    sample = sample_of(q, model, (method,), None, weights)
    if sample is None:
        return (np.nan, np.nan, np.nan, 0)
    if sample.n_seeds >= 2:
        e = S.paired(sample.per_seed(method))
        return (e.estimate, e.ci_low, e.ci_high, e.seeds)
    values = sample.values[method][0]  # one seed: a normal interval over problems
    mean = float(values @ sample.weights)
    se = float(np.sqrt(((values - mean) ** 2 * sample.weights**2).sum()))
    z = st.norm.ppf(1 - S.LEVEL / 2)
    return (mean, mean - z * se, mean + z * se, 1)


def pass_at_k_curves(pp: pd.DataFrame, model: str, methods: list[str]) -> pd.DataFrame:
    """(method, x = k, mean, low, high, seeds): pass@k for k = 1, 2, 4, .. n of ``methods`` on their final
    checkpoint (the base model at step 0)."""
    sub = pp[(pp["model"] == model) & pp["method"].isin(methods)]
    if sub.empty:
        return pd.DataFrame(columns=COLUMNS)
    n = int(sub["n"].min())
    ks = sorted({*(2**i for i in range(int(np.log2(n)) + 1)), n})
    rows = []
    for k in ks:
        q = problem_quantity(sub, f"pass_at_{k}", 1)
        for method in [m for m in methods if m in set(q["method"])]:
            rows.append((method, k, *_band(q, model, method)))
    return pd.DataFrame(rows, columns=COLUMNS)


def over_steps(
    pp: pd.DataFrame, model: str, metric: str, methods: list[str], factor: float = 1.0, weights=None
) -> pd.DataFrame:
    """(method, x = step, mean, low, high, seeds): ``metric`` ("distinct", "pass_at_K", "avg_at_K",
    "oversharpened" with ``factor``) of each of ``methods`` at every evaluated checkpoint, and of the base model
    (every run's start, and over-sharpening's reference) at step 0; ``weights``: the splits', as ``sample_of``."""
    order = [BASE, *[m for m in methods if m != BASE]]
    sub = pp[(pp["model"] == model) & pp["method"].isin(order)]
    base = sub[sub["method"] == BASE]
    rows = []
    for step in sorted(sub["step"].unique()):
        at = sub[(sub["step"] == step) & (sub["method"] != BASE)]
        q = problem_quantity(pd.concat([at, base]) if step else base, metric, 1, factor)  # one step at a time
        shown = set(at["method"]) if step else {BASE}
        for method in [m for m in order if m in shown]:
            rows.append((method, step, *_band(q, model, method, weights)))
    return pd.DataFrame(rows, columns=COLUMNS)


def smoothed(train: pd.DataFrame) -> pd.DataFrame:
    """``train`` with ``smooth``: each (method, seed)'s entropy averaged over 5 steps (for reading; Figure 6)."""
    out = train.sort_values(["method", "seed", "step"]).copy()
    out["smooth"] = out.groupby(["method", "seed"])["entropy"].transform(lambda s: s.rolling(5, min_periods=1).mean())
    return out


def entropy_over_steps(train: pd.DataFrame, model: str) -> pd.DataFrame:
    """(method, x = step, mean, low, high, seeds): 5-step mean entropy, t-interval over seeds at each step."""
    if train.empty:
        return pd.DataFrame(columns=COLUMNS)
    sub = smoothed(train[train["model"] == model])
    g = sub.groupby(["method", "step"])["smooth"]
    out = g.agg(["mean", "std", "count"]).reset_index()
    half = out["std"] / np.sqrt(out["count"]) * st.t.ppf(1 - S.LEVEL / 2, (out["count"] - 1).clip(lower=1))
    out["low"], out["high"] = out["mean"] - half, out["mean"] + half
    return out.rename(columns={"count": "seeds", "step": "x"})[COLUMNS]
