"""The paper's Tables 2-5 in miniature: peak over checkpoints per cell, as the paper reports them.

The paper evaluates a checkpoint every 50 steps and reports each method's peak per cell (benchmark x metric);
its "Avg." column is the mean of the row's cells (each benchmark's peak), and so is ours. Picking the best
checkpoint per cell is selection on the test set: these tables are the paper's reporting, labelled as such,
while the claims (``calibrl.report.claims``) are decided on a quantity fixed in advance. Best and second best
per column are marked as in the paper (bold, underline).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from calibrl.io import write_csv, write_text
from calibrl.report.load import metrics

TITLES = {
    "table2": "Table 2: {avg} (%)",
    "table3": "Table 3: {pas} (%)",
    "table4": "Table 4: compatibility with DAPO (main model)",
    "table5": "Table 5: sensitivity to alpha (grpo = alpha 0, iac = alpha 1) and filtering",
}
PEAK_NOTE = (
    "Peak over checkpoints per cell (the paper's reporting: the best checkpoint is chosen on the test set), "
    "percent; Avg. is the mean of the row's cells, as in the paper"
)


def peak_table(evals: pd.DataFrame, metric: str, seed: int, splits: Sequence[str] = ()) -> pd.DataFrame:
    """(model, method) x split peak values of ``metric`` in percent, and "Avg.", the mean of the row's peaks.

    Columns follow ``splits`` (the config's eval_splits), then any other split in the files' order."""
    sub = evals[(evals["metric"] == metric) & (evals["seed"] == seed)]
    per_ckpt = sub.pivot_table(index=["model", "method", "step"], columns="split", values="value")
    order = [s for s in splits if s in per_ckpt.columns] + list(dict.fromkeys(sub["split"]))
    per_ckpt = per_ckpt[[s for s in dict.fromkeys(order) if s in per_ckpt.columns]]
    peaks = per_ckpt.groupby(level=["model", "method"]).max() * 100
    peaks["Avg."] = peaks.mean(axis=1)  # the paper's Avg.: the mean of the row, each cell its own peak
    return peaks.round(2)


def _marks(frame: pd.DataFrame, group: str | None, row_wise: bool = False) -> pd.DataFrame:
    """'best'/'second' marks per column (within each ``group`` of rows), or per row."""
    if row_wise:
        return _marks(frame.T, None).T
    marks = pd.DataFrame("", index=frame.index, columns=frame.columns)
    groups = [frame] if group is None else [g for _, g in frame.groupby(level=group, sort=False)]
    for g in groups:
        for col in g.columns:
            ranked = g[col].rank(ascending=False, method="min")
            marks.loc[ranked[ranked == 1].index, col] = "best"
            marks.loc[ranked[ranked == 2].index, col] = "second"
    return marks


def to_markdown(frame: pd.DataFrame, title: str, group: str | None = None, row_wise: bool = False) -> str:
    marks = _marks(frame, group, row_wise)
    idx_names = [n or "" for n in frame.index.names]
    lines = [
        f"### {title}",
        "",
        "| " + " | ".join(idx_names + list(frame.columns)) + " |",
        "|" + "---|" * (len(idx_names) + len(frame.columns)),
    ]
    for key, row in frame.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        cells = []
        for col, value in row.items():
            text = f"{value:.2f}"
            mark = marks.loc[key if len(key) > 1 else key[0], col]
            cells.append(f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" else text)
        lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
    lines.append("")
    where = "row" if row_wise else "column" + (f" within each {group}" if group else "")
    lines.append(f"{PEAK_NOTE}; **best**, <u>second best</u> per {where}.")
    return "\n".join(lines) + "\n"


def _ordered(frame: pd.DataFrame, models: list[str], methods: list[str]) -> pd.DataFrame:
    """Rows in config order: each model's block, its methods in the table's order."""
    rows = [(mo, me) for mo in models for me in methods if (mo, me) in frame.index]
    return frame.loc[rows]


def build_tables(evals: pd.DataFrame, grid: dict) -> dict[str, pd.DataFrame]:
    seed, main, tables = grid["seed"], grid["main_model"], grid["tables"]
    splits = grid["data"]["eval_splits"]
    out = {}
    avg, pas = metrics(grid)
    for metric, name in ((avg, "table2"), (pas, "table3")):
        peaks = peak_table(evals, metric, seed, splits)
        out[name] = _ordered(peaks, list(grid["models"]), tables["table2_3"])
    t4 = []
    for metric, label in metrics(grid).items():
        peaks = peak_table(evals, metric, seed, splits).loc[main]
        t4.append(peaks.loc[[m for m in tables["table4"] if m in peaks.index]].assign(metric=label))
    out["table4"] = pd.concat(t4).reset_index().set_index(["metric", "method"])
    t5 = []
    for metric, label in metrics(grid).items():
        peaks = peak_table(evals, metric, seed, splits).loc[main]
        cols = [m for m in tables["table5"] if m in peaks.index]
        t5.append(peaks.loc[cols].T.assign(metric=label).reset_index().rename(columns={"split": "dataset"}))
    out["table5"] = pd.concat(t5).set_index(["metric", "dataset"])
    return out


def write_tables(tables: dict[str, pd.DataFrame], out_dir: str | Path, grid: dict) -> dict[str, Path]:
    avg, pas = metrics(grid).values()
    titles = {name: title.format(avg=avg, pas=pas) for name, title in TITLES.items()}
    groups = {"table2": "model", "table3": "model", "table4": "metric", "table5": None}
    paths = {}
    for name, frame in tables.items():
        out = Path(out_dir)
        write_csv(out / f"{name}.csv", frame.reset_index())
        write_text(out / f"{name}.md", to_markdown(frame, titles[name], groups[name], row_wise=name == "table5"))
        paths[name] = out / f"{name}.md"
    return paths
