"""The grid's figures, drawn one way: each method's mean over seeds with its 95% interval (frames of
``calibrl.report.sharpening``: method, x, mean, low, high, seeds), one colour per method in every figure.

Only what was measured is drawn: a marker with its interval at each evaluated x; a line and a band between them
only where a method has at least :data:`DENSE` points (a band between two checkpoints would suggest values
nobody measured). Where methods share an x, their markers are set side by side. Legends and titles stay inside
the saved canvas. Beside each PNG, ``<name>.csv`` holds exactly what was plotted (after scaling), so a test can
compare a figure with the seed-level results.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from calibrl.analysis_plan import BASE  # noqa: E402
from calibrl.io import atomic_path, write_csv  # noqa: E402
from calibrl.report.sharpening import smoothed  # noqa: E402

DENSE = 3  # points from which a method's markers are joined by a line and a band
Panel = tuple[pd.DataFrame, str, str, float]  # (band frame, title, y label, scale)


def palette(grid: dict) -> dict[str, tuple]:
    """One colour per method, fixed by the config's method order (the base model black), in every figure."""
    distinct = [*plt.cm.tab10.colors, *plt.cm.Dark2.colors]  # 18 colours no two of which are shades of one
    colors = {BASE: (0.0, 0.0, 0.0)}
    for i, method in enumerate(grid["methods"]):
        colors[method] = distinct[i % len(distinct)]
    return colors


def _draw(ax, frame: pd.DataFrame, colors: dict, title: str, ylabel: str, xlabel: str, scale: float) -> list[dict]:
    drawn = []
    methods = list(dict.fromkeys(frame["method"]))
    xs = np.sort(frame["x"].unique()) if len(frame) else np.array([0.0])
    gap = float(np.diff(xs).min()) if len(xs) > 1 else 1.0
    sparse = [m for m in methods if frame.loc[frame["method"] == m, "x"].nunique() < DENSE]
    at = {x: [m for m in sparse if ((frame["method"] == m) & (frame["x"] == x)).any()] for x in xs}
    width = 0.6 * gap / max(max((len(v) for v in at.values()), default=1), 1)  # side by side where they would overlap
    for method in methods:
        line = frame[frame["method"] == method].sort_values("x")
        seeds = int(line["seeds"].max())
        x = line["x"].to_numpy(dtype=float)
        if method in sparse:
            x = np.array([v + (at[v].index(method) - (len(at[v]) - 1) / 2) * width for v in line["x"]])
        mean, low, high = (line[c].to_numpy(dtype=float) * scale for c in ("mean", "low", "high"))
        color = colors.get(method, (0.5, 0.5, 0.5))
        dense = method not in sparse
        err = np.vstack([mean - low, high - mean])
        ax.errorbar(x, mean, yerr=None if np.isnan(err).all() else err, fmt="o", ms=3.5, color=color, capsize=2,
                    ls="--" if dense and method == BASE else "-" if dense else "none", lw=1.2,
                    label=f"{method} ({seeds} seed{'s' * (seeds != 1)})")  # fmt: skip
        if dense:
            ax.fill_between(x, low, high, color=color, alpha=0.15, lw=0)
        drawn += [{"panel": title, "method": method, "x": float(a), "y": float(b), "low": float(c), "high": float(d),
                   "seeds": seeds} for a, b, c, d in zip(line["x"], mean, low, high)]  # fmt: skip
    if methods and len(sparse) == len(methods):
        ax.set_xticks(xs)  # the evaluated steps, not an axis that suggests others
    ax.set_title("\n".join(textwrap.wrap(title, 52)), fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if methods:
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no results", ha="center", transform=ax.transAxes)
    return drawn


def plot_panels(panels: list[Panel], xlabel: str, path: str | Path, colors: dict,
                reference: dict[str, tuple[float, float]] | None = None) -> pd.DataFrame:  # fmt: skip
    """One panel per (frame, title, ylabel, scale), at most two a row, in one PNG; ``reference``: {label: (low,
    high)} drawn as grey bands on every panel (the paper's levels). Returns what was plotted, also written beside
    the PNG as ``<name>.csv``."""
    ncols = min(2, max(len(panels), 1))
    nrows = -(-max(len(panels), 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.0 * nrows), squeeze=False)
    drawn = []
    for ax, (frame, title, ylabel, scale) in zip(axes.flat, panels):
        for i, (label, (low, high)) in enumerate((reference or {}).items()):
            ax.axhspan(low - 0.002, high + 0.002, color="grey", alpha=0.15 + 0.15 * i, label=label)
        drawn += _draw(ax, frame, colors, title, ylabel, xlabel, scale)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight")  # the legends beside the panels included
    plt.close(fig)
    plotted = pd.DataFrame(drawn, columns=["panel", "method", "x", "y", "low", "high", "seeds"])
    write_csv(Path(path).with_suffix(".csv"), plotted)
    return plotted


def figure6_reference(matched: bool) -> dict[str, tuple[float, float]] | None:
    """The paper's Figure 6 levels as bands, only when our grid is the paper's (otherwise the scale differs)."""
    if not matched:
        return None
    from calibrl.published import figure6_levels

    lv = figure6_levels()
    return {
        f"paper: dapo about {lv['dapo']['settles_at']:g}": (lv["dapo"]["settles_at"], lv["dapo"]["settles_at"]),
        f"paper: dapo_iac {lv['dapo_iac']['low']:g}-{lv['dapo_iac']['high']:g}": (
            lv["dapo_iac"]["low"],
            lv["dapo_iac"]["high"],
        ),
    }


def figure6(train: pd.DataFrame, grid: dict) -> pd.DataFrame:
    """Entropy over steps for the Figure 6 methods on the main model: each seed's smoothed over 5 steps for reading
    (as ``sharpening.entropy_over_steps``, which the figure draws), then the mean over every seed (``seeds``)."""
    sub = train[(train["model"] == grid["main_model"]) & (train["method"].isin(grid["tables"]["figure6"]))]
    if sub.empty:
        return pd.DataFrame(columns=["method", "step", "entropy", "entropy_smoothed", "seeds"])
    return (
        smoothed(sub)
        .groupby(["method", "step"], as_index=False)
        .agg(entropy=("entropy", "mean"), entropy_smoothed=("smooth", "mean"), seeds=("seed", "nunique"))
    )
