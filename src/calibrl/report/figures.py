"""Figures of the grid: curves over training steps (every method) and the paper's Figure 6 (entropy)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from calibrl.io import atomic_path  # noqa: E402


def plot_over_steps(
    frame: pd.DataFrame,
    value: str,
    by: str,
    title: str,
    ylabel: str,
    path: str | Path,
    panels: str | None = None,
    reference: dict[str, tuple[float, float]] | None = None,
) -> None:
    """One line per ``by`` (method) over training steps, one panel per ``panels`` value (benchmark, model),
    at most three panels a row; ``reference``: {label: (low, high)} drawn as grey bands (the paper's levels)."""
    keys = [None] if panels is None else list(dict.fromkeys(frame[panels]))
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    legend_in = 0.4  # inches below the panels for the shared legend
    height = 3.3 * nrows + legend_in
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, height), squeeze=False)
    names = list(dict.fromkeys(frame[by])) if len(frame) else []
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    for ax, key in zip(axes.flat, keys):
        sub = frame if key is None else frame[frame[panels] == key]
        for name, line in sub.groupby(by, sort=False):
            line = line.sort_values("step")
            marker = "o" if len(line) < 30 else None
            ax.plot(line["step"], line[value], marker=marker, ms=3, color=colors[name], label=str(name))
        for i, (label, (low, high)) in enumerate((reference or {}).items()):
            ax.axhspan(low - 0.002, high + 0.002, color="grey", alpha=0.15 + 0.15 * i, label=label)
        ax.set_title(title if key is None else f"{title}: {key}", fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:  # one legend for all panels, below them, so no curve is hidden
        fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_in * (1 + (len(labels) > 6)) / height, 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


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
    """Entropy over steps for the Figure 6 methods on the main model (smoothed over 5 steps for reading)."""
    sub = train[
        (train["model"] == grid["main_model"])
        & (train["seed"] == grid["seed"])
        & (train["method"].isin(grid["tables"]["figure6"]))
    ]
    sub = sub[["method", "step", "entropy"]].sort_values(["method", "step"]).copy()
    sub["entropy_smoothed"] = sub.groupby("method")["entropy"].transform(lambda s: s.rolling(5, min_periods=1).mean())
    return sub
