"""PNG plots of the toy figures, in the spirit of the paper's Figures 1-5 (seed means with 10-90% bands)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: rules run on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from calibrl.io import atomic_path  # noqa: E402
from calibrl.toy.figures import FIGURES  # noqa: E402

LAYOUT = {  # figure -> (row factors, column factor, quantities drawn); one row per learning rate of the range too
    "fig1": (("lr_scale",), "estimator", ("p_winner", "p_loser")),
    "fig2": (("lr_scale",), "siamese", ("p_siamese_heldout",)),
    "fig3": (("lr_scale",), "estimator", ("p_winner", "p_loser")),
    "fig4": (("lr_scale",), "optimizer", ("p_winner", "p_loser")),
    "fig5": (("estimator", "optimizer", "lr_scale"), "variant", ("p_winner", "p_loser")),
}
NAMES = {
    "p_winner": "winning correct label",
    "p_loser": "other correct label",
    "p_siamese_heldout": "pi(Siamese | Siamese query)",
}


def plot_figure(figure: str, curves: pd.DataFrame, path: str | Path) -> None:
    rows_by, col_by, quantities = LAYOUT[figure]
    rows_by = tuple(r for r in rows_by if r in curves)
    row_keys = [()] if not rows_by else sorted(curves.groupby(list(rows_by)).groups)
    col_keys = list(dict.fromkeys(curves[col_by]))
    sizes = sorted(curves["group_size"].unique())
    xmax = float(curves["step"].max())
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(
        len(row_keys),
        len(col_keys),
        figsize=(4.2 * len(col_keys), 3.2 * len(row_keys)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    for r, rkey in enumerate(row_keys):
        rkey = rkey if isinstance(rkey, tuple) else (rkey,)
        sub = curves
        for name, value in zip(rows_by, rkey):
            sub = sub[sub[name] == value]
        for c, ckey in enumerate(col_keys):
            ax = axes[r][c]
            ax.set_xlim(0, xmax)
            ax.set_ylim(-0.02, 1.02)
            ax.set_autoscale_on(False)  # limits are known: autoscaling 36 shared axes per band is most of the time
            panel = sub[sub[col_by] == ckey]
            for i, g in enumerate(sizes):
                for q, style in zip(quantities, ("-", "--")):
                    line = panel[(panel["group_size"] == g) & (panel["quantity"] == q)]
                    label = f"G={g}" + (f", {NAMES[q]}" if len(quantities) > 1 else "")
                    ax.plot(line["step"], line["mean"], style, color=colors[i], label=label)
                    ax.fill_between(line["step"], line["q10"], line["q90"], color=colors[i], alpha=0.07)
            title = ", ".join([f"{n}={v:g}" if n == "lr_scale" else f"{n}={v}" for n, v in zip(rows_by, rkey)]
                              + [f"{col_by}={ckey}"])  # fmt: skip
            ax.set_title(title, fontsize=8)
            ax.grid(alpha=0.3)
        axes[r][0].set_ylabel("probability (Persian query)" if figure != "fig2" else "held-out accuracy")
    for ax in axes[-1]:
        ax.set_xlabel("training step")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{FIGURES[figure]}: seed mean, band = 10-90% of seeds", fontsize=10)
    # fixed margins (in inches, so tall figures keep them): tight_layout measures every axis, seconds for fig5
    height, width = fig.get_figheight(), fig.get_figwidth()
    fig.subplots_adjust(left=0.7 / width, right=1 - 0.15 / width, bottom=0.5 / height, top=1 - 0.55 / height,
                        wspace=0.08, hspace=0.3)  # fmt: skip
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
