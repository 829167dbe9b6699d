"""Measures of over-sharpening, per method, with 95% bands over seeds (then problems).

- pass@k for k = 1..n (the unbiased estimator from each problem's n samples) on the claims' checkpoints: a
  sharpened policy gains at k = 1 and loses at large k (Section 1: RLVR sharpens rather than extends);
- distinct correct answers per problem (out of n samples), per checkpoint: the solution modes still produced;
- training entropy per step (Figure 6's quantity), smoothed over 5 steps.
Bands come from the same paired hierarchical bootstrap as the claims (``calibrl.report.stats``); with one seed
a band covers the problems only, and the figure says so.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats as st  # noqa: E402

from calibrl import stats as S  # noqa: E402
from calibrl.io import atomic_path  # noqa: E402
from calibrl.metrics import pass_at_k  # noqa: E402
from calibrl.report.claims import sample_of  # noqa: E402

BAND_REPS = 400


def _band(q: pd.DataFrame, model: str, method: str) -> tuple[float, float, float, int]:
    """(mean, low, high, seeds) of one method's per-problem quantity ``q``; one seed: problems only."""
    sample = sample_of(q, model, (method,))
    if sample is None:
        return (np.nan, np.nan, np.nan, 0)
    if sample.n_seeds >= 2:
        e = S.bootstrap(sample, lambda m: m[method], reps=BAND_REPS)
        return (e.estimate, e.ci_low, e.ci_high, e.seeds)
    values = sample.values[method][0]  # one seed: a normal interval over problems
    mean = float(values @ sample.weights)
    se = float(np.sqrt(((values - mean) ** 2 * sample.weights**2).sum()))
    z = st.norm.ppf(1 - S.LEVEL / 2)
    return (mean, mean - z * se, mean + z * se, 1)


def pass_at_k_curves(pp: pd.DataFrame, model: str, last: int) -> pd.DataFrame:
    """(method, k, mean, low, high, seeds): pass@k for k = 1..n on the last ``last`` checkpoints."""
    sub = pp[pp["model"] == model]
    if sub.empty:
        return pd.DataFrame(columns=["method", "k", "mean", "low", "high", "seeds"])
    sub = sub[sub["step"].isin(sorted(sub["step"].unique())[-last:])]
    n = int(sub["n"].min())
    rows = []
    for k in range(1, n + 1):
        q = sub.assign(q=[pass_at_k(nn, c, k) for nn, c in zip(sub["n"], sub["correct"])])
        q = q.groupby(["model", "method", "seed", "split", "problem"], as_index=False)["q"].mean()
        for method in q["method"].unique():
            rows.append((method, k, *_band(q, model, method)))
    return pd.DataFrame(rows, columns=["method", "k", "mean", "low", "high", "seeds"])


def distinct_over_steps(pp: pd.DataFrame, model: str) -> pd.DataFrame:
    """(method, step, mean, low, high, seeds): distinct correct answers per problem at each checkpoint."""
    rows = []
    sub = pp[pp["model"] == model]
    for step, at in sub.groupby("step"):
        q = at.rename(columns={"distinct": "q"})
        for method in q["method"].unique():
            rows.append((method, step, *_band(q, model, method)))
    return pd.DataFrame(rows, columns=["method", "step", "mean", "low", "high", "seeds"])


def entropy_over_steps(train: pd.DataFrame, model: str) -> pd.DataFrame:
    """(method, step, mean, low, high, seeds): 5-step mean entropy, t-interval over seeds at each step."""
    if train.empty:
        return pd.DataFrame(columns=["method", "step", "mean", "low", "high", "seeds"])
    sub = train[train["model"] == model].sort_values(["method", "seed", "step"]).copy()
    sub["smooth"] = sub.groupby(["method", "seed"])["entropy"].transform(lambda s: s.rolling(5, min_periods=1).mean())
    g = sub.groupby(["method", "step"])["smooth"]
    out = g.agg(["mean", "std", "count"]).reset_index()
    half = out["std"] / np.sqrt(out["count"]) * st.t.ppf(1 - S.LEVEL / 2, (out["count"] - 1).clip(lower=1))
    out["low"], out["high"] = out["mean"] - half, out["mean"] + half
    return out.rename(columns={"count": "seeds"})[["method", "step", "mean", "low", "high", "seeds"]]


def plot_bands(frame: pd.DataFrame, x: str, title: str, ylabel: str, path: str | Path, scale: float = 1.0) -> None:
    """One line per method with its 95% band; the legend gives each method's seeds."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, (method, line) in enumerate(frame.groupby("method", sort=False)):
        line = line.sort_values(x)
        color = plt.cm.tab10(i % 10)
        seeds = int(line["seeds"].max()) if len(line) else 0
        ax.plot(line[x], line["mean"] * scale, color=color, marker="o", ms=3, label=f"{method} ({seeds} seeds)")
        ax.fill_between(line[x], line["low"] * scale, line["high"] * scale, color=color, alpha=0.15, lw=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(frame):
        ax.legend(fontsize=7, ncol=2, frameon=False)
    else:
        ax.text(0.5, 0.5, "no per-problem results", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
