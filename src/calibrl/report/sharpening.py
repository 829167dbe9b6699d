"""Measures of over-sharpening, per method, with 95% bands over seeds.

- pass@k for k = 1, 2, 4, .. n (the unbiased estimator from each problem's n samples) of the base model and the
  final checkpoints: a sharpened policy gains at k = 1 and loses at large k (Section 1: RLVR sharpens rather
  than extends);
- any per-problem metric (distinct correct answers, PASS@k) per checkpoint, each arm's curve starting from the
  base model at step 0 (evaluated with the same seeds' sampling streams);
- training entropy per step (Figure 6's quantity), smoothed over 5 steps.
Bands are t intervals over the per-seed values (the unit of replication, ``calibrl.stats``); with one seed a
band covers the problems only, and the legend says so.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats as st  # noqa: E402

from calibrl import stats as S  # noqa: E402
from calibrl.analysis_plan import BASE  # noqa: E402
from calibrl.io import atomic_path  # noqa: E402
from calibrl.report.claims import problem_quantity, sample_of  # noqa: E402

COLUMNS = ["method", "x", "mean", "low", "high", "seeds"]


def _band(q: pd.DataFrame, model: str, method: str) -> tuple[float, float, float, int]:
    """(mean, low, high, seeds) of one method's per-problem quantity ``q``; one seed: problems only."""
    sample = sample_of(q, model, (method,))
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


def over_steps(pp: pd.DataFrame, model: str, metric: str, methods: list[str]) -> pd.DataFrame:
    """(method, x = step, mean, low, high, seeds): ``metric`` ("distinct", "pass_at_K", "avg_at_K") of each of
    ``methods`` at every checkpoint, from the base model at step 0 (its rows stand for every method there)."""
    sub = pp[pp["model"] == model]
    base = sub[sub["method"] == BASE]
    runs = sub[sub["method"].isin([m for m in methods if m != BASE])]
    starts = [base.assign(method=m) for m in runs["method"].unique()]
    full = pd.concat([runs, *starts, base if BASE in methods else base.iloc[:0]], ignore_index=True)
    rows = []
    for step, at in full.groupby("step"):
        q = problem_quantity(at, metric, 1)  # one step at a time
        for method in [m for m in methods if m in set(q["method"])]:
            rows.append((method, step, *_band(q, model, method)))
    return pd.DataFrame(rows, columns=COLUMNS)


def entropy_over_steps(train: pd.DataFrame, model: str) -> pd.DataFrame:
    """(method, x = step, mean, low, high, seeds): 5-step mean entropy, t-interval over seeds at each step."""
    if train.empty:
        return pd.DataFrame(columns=COLUMNS)
    sub = train[train["model"] == model].sort_values(["method", "seed", "step"]).copy()
    sub["smooth"] = sub.groupby(["method", "seed"])["entropy"].transform(lambda s: s.rolling(5, min_periods=1).mean())
    g = sub.groupby(["method", "step"])["smooth"]
    out = g.agg(["mean", "std", "count"]).reset_index()
    half = out["std"] / np.sqrt(out["count"]) * st.t.ppf(1 - S.LEVEL / 2, (out["count"] - 1).clip(lower=1))
    out["low"], out["high"] = out["mean"] - half, out["mean"] + half
    return out.rename(columns={"count": "seeds", "step": "x"})[COLUMNS]


def _draw(ax, frame: pd.DataFrame, title: str, ylabel: str, xlabel: str, scale: float) -> None:
    for i, (method, line) in enumerate(frame.groupby("method", sort=False)):
        line = line.sort_values("x")
        color = plt.cm.tab10(i % 10)
        seeds = int(line["seeds"].max()) if len(line) else 0
        style = "--" if method == BASE else "-"
        ax.plot(
            line["x"], line["mean"] * scale, style, color=color, marker="o", ms=3, label=f"{method} ({seeds} seeds)"
        )
        ax.fill_between(line["x"], line["low"] * scale, line["high"] * scale, color=color, alpha=0.15, lw=0)
    ax.set_title("\n".join(textwrap.wrap(title, 48)), fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(frame):
        ax.legend(fontsize=7, ncol=2, frameon=False)
    else:
        ax.text(0.5, 0.5, "no per-problem results", ha="center", transform=ax.transAxes)


def plot_bands(frame: pd.DataFrame, xlabel: str, title: str, ylabel: str, path: str | Path, scale: float = 1.0) -> None:
    """One line per method with its 95% band; the legend gives each method's seeds."""
    plot_panels([(frame, title, ylabel, scale)], xlabel, path)


def plot_panels(panels: list[tuple[pd.DataFrame, str, str, float]], xlabel: str, path: str | Path) -> None:
    """One panel per (frame, title, ylabel, scale), side by side, in one PNG."""
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.2 * max(len(panels), 1) + 1, 4.2), squeeze=False)
    for ax, (frame, title, ylabel, scale) in zip(axes[0], panels):
        _draw(ax, frame, title, ylabel, xlabel, scale)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
