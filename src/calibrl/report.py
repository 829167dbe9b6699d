"""Aggregation of the grid into the paper's tables and figures (Tables 2-5, Figure 6), read from files only.

The paper evaluates a checkpoint every 50 steps and reports each method's peak. We take the peak over
checkpoints per cell (benchmark x metric), and for the "Avg." column the peak of the per-checkpoint
average, which is the most literal reading. Best and second best per column are marked as in the paper
(bold, underline).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from calibrl.io import atomic_path, write_csv, write_text  # noqa: E402

log = logging.getLogger("calibrl.report")


def metrics(grid: dict) -> dict[str, str]:
    """Metric keys of the evaluation files and their table labels, e.g. avg_at_8 -> AVG@8."""
    k = grid["eval"]["k"]
    return {f"avg_at_{k}": f"AVG@{k}", f"pass_at_{k}": f"PASS@{k}"}


# ------------------------------------------------------------------------------------------ loading
def load_evals(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    """Long frame (model, method, seed, step, split, metric, value) from ``runs/{model}/{method}/s{seed}/eval``."""
    rows = []
    for path in paths:
        path = Path(path)
        rel = path.resolve().relative_to(Path(root).resolve())
        model, method, seed = rel.parts[-5], rel.parts[-4], int(rel.parts[-3][1:])
        data = json.loads(path.read_text())
        for split, metrics in data["splits"].items():
            for metric, value in metrics.items():
                rows.append((model, method, seed, int(data["step"]), split, metric, float(value)))
    return pd.DataFrame(rows, columns=["model", "method", "seed", "step", "split", "metric", "value"])


def load_train_metrics(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    frames = []
    for path in paths:
        path = Path(path)
        rel = path.resolve().relative_to(Path(root).resolve())
        model, method, seed = rel.parts[-4], rel.parts[-3], int(rel.parts[-2][1:])
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        frames.append(pd.DataFrame(lines).assign(model=model, method=method, seed=seed))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ------------------------------------------------------------------------------------------- tables
def peak_table(evals: pd.DataFrame, metric: str, seed: int, splits: Sequence[str] = ()) -> pd.DataFrame:
    """(model, method) x split peak values of ``metric`` in percent, plus the peak of the average.

    Columns follow ``splits`` (the config's eval_splits), then any other split in the files' order."""
    sub = evals[(evals["metric"] == metric) & (evals["seed"] == seed)]
    per_ckpt = sub.pivot_table(index=["model", "method", "step"], columns="split", values="value")
    order = [s for s in splits if s in per_ckpt.columns] + list(dict.fromkeys(sub["split"]))
    per_ckpt = per_ckpt[[s for s in dict.fromkeys(order) if s in per_ckpt.columns]]
    per_ckpt["Avg."] = per_ckpt.mean(axis=1)
    return (per_ckpt.groupby(level=["model", "method"]).max() * 100).round(2)


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
    lines.append(f"Peak over checkpoints, percent; **best**, <u>second best</u> per {where}.")
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


# ------------------------------------------------------------------------------------------ figures
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


# ------------------------------------------------------------------------------- beside the paper
KEYS = ["table", "model", "method", "benchmark", "metric"]
TITLES = {
    "table2": "Table 2: {avg} (%)",
    "table3": "Table 3: {pas} (%)",
    "table4": "Table 4: compatibility with DAPO (main model)",
    "table5": "Table 5: sensitivity to alpha (grpo = alpha 0, iac = alpha 1) and filtering",
}
CELLS_NOTE = "Same models, benchmarks and metrics as the paper: compared cell by cell (ours / paper (ours - paper))."
ORDER_NOTE = (
    "Our models, benchmarks or metrics are not the paper's (e.g. the CPU grid: tiny models, the countdown task), "
    "so absolute numbers cannot match: only orderings and signs of differences are compared."
)


def long_form(tables: dict[str, pd.DataFrame], grid: dict) -> pd.DataFrame:
    """Our tables as one row per number, in the layout of ``calibrl.published.cells()`` (without marks)."""
    avg, pas = metrics(grid).values()
    main = grid["main_model"]
    rows = []
    for name, label in (("table2", avg), ("table3", pas)):
        for (model, method), row in tables[name].iterrows():
            rows += [(name, model, method, bench, label, v) for bench, v in row.items()]
    for (label, method), row in tables["table4"].iterrows():
        rows += [("table4", main, method, bench, label, v) for bench, v in row.items()]
    for (label, bench), row in tables["table5"].iterrows():
        rows += [("table5", main, method, bench, label, v) for method, v in row.items()]
    frame = pd.DataFrame(rows, columns=KEYS + ["value"]).dropna(subset=["value"])
    return frame.assign(mark=_long_marks(frame))


def _long_marks(frame: pd.DataFrame) -> pd.Series:
    """best/second per (table, model, benchmark, metric), as the paper ranks its columns."""
    rank = frame.groupby(["table", "model", "benchmark", "metric"])["value"].rank(ascending=False, method="min")
    return rank.map({1.0: "best", 2.0: "second"}).fillna("")


def beside_paper(ours: pd.DataFrame, paper: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """(ours, paper, diff) per cell, and whether any cell matches (False: the grids are not comparable).

    Matched cells are one row each; when nothing matches, our rows and the paper's rows are stacked, so the
    CSV always has the same columns.
    """
    paper = paper[paper["table"].isin(ours["table"].unique())]
    # Ours in our row order, then the paper's cells we have no counterpart for, in the paper's order.
    left = ours.merge(paper, on=KEYS, how="left", suffixes=("_ours", "_paper"))
    rest = paper.merge(ours[KEYS], on=KEYS, how="left", indicator=True)
    rest = rest[rest["_merge"] == "left_only"].drop(columns="_merge")
    rest = rest.rename(columns={"value": "value_paper", "mark": "mark_paper"})
    merged = pd.concat([left, rest], ignore_index=True)
    merged = merged.rename(columns={"value_ours": "ours", "value_paper": "paper"})
    merged["diff"] = (merged["ours"] - merged["paper"]).round(2)
    matched = bool(merged[["ours", "paper"]].notna().all(axis=1).any())
    return merged[KEYS + ["ours", "paper", "diff", "mark_ours", "mark_paper"]], matched


def _diffs(frame: pd.DataFrame, table: str, a: str, b: str) -> pd.Series:
    """value(a) - value(b) per (model, metric, benchmark) cell of ``table`` where both exist."""
    sub = frame[(frame["table"] == table) & frame["method"].isin([a, b])]
    wide = sub.pivot_table(index=["model", "metric", "benchmark"], columns="method", values="value")
    if a not in wide or b not in wide:
        return pd.Series(dtype=float)
    return (wide[a] - wide[b]).dropna()


def _margin_best(frame: pd.DataFrame, table: str, a: str) -> pd.Series:
    """value(a) minus the best other method per cell of ``table`` (> 0: a is strictly best)."""
    sub = frame[frame["table"] == table]
    wide = sub.pivot_table(index=["model", "metric", "benchmark"], columns="method", values="value")
    if a not in wide or wide.shape[1] < 2:
        return pd.Series(dtype=float)
    return (wide[a] - wide.drop(columns=[a]).max(axis=1)).dropna()


def _count(d: pd.Series) -> str:
    avg = [f"{k[0]} {k[1]} {d[k]:+.2f}" for k in d.index if k[2] == "Avg."]
    return f"{int((d > 0).sum())}/{len(d)} cells" + (f" (Avg.: {'; '.join(avg)})" if avg else "")


def _verdict(paper: pd.Series, ours: pd.Series) -> bool | None:
    """Holds when ours has the paper's direction: everywhere if the paper has it everywhere, else mostly."""
    if ours.empty or paper.empty:
        return None
    share = (ours > 0).mean()
    if (paper > 0).all():
        return bool(share == 1)
    if (paper > 0).mean() > 0.5:
        return bool(share > 0.5)
    return bool(share <= 0.5)


def paper_checks(ours: pd.DataFrame, paper: pd.DataFrame, fig6: pd.DataFrame, grid: dict) -> list[dict]:
    """The paper's orderings (read from its published numbers) checked on ours, each with both sides' numbers.

    A claim "A above B" is counted over the cells (model, metric, benchmark) of a table; "A best" means strictly
    above every other method of the table in that cell (ties do not count). Our cells are our models and
    benchmarks, so for the CPU grid this compares signs, not values; on the paper's grid, only the cells the
    paper printed count.
    """
    checks = []
    same = ours[KEYS].merge(paper[KEYS], on=KEYS).shape[0] > 0

    def add(table, claim, p, o):
        if same and len(p):  # the paper's grid: judge the claim on the paper's own cells only
            o = o[o.index.isin(p.index)]
        checks.append(
            {
                "table": table,
                "claim": claim,
                "paper": _count(p) if len(p) else "n/a",
                "ours": _count(o) if len(o) else "n/a",
                "holds": _verdict(p, o),
            }
        )

    avg, pas = metrics(grid).values()
    for table, label in (("table2", avg), ("table3", pas)):
        for base in [m for m in grid["tables"]["table2_3"] if m != "iac"]:
            add(
                table,
                f"IAC above {base} ({label})",
                _diffs(paper, table, "iac", base),
                _diffs(ours, table, "iac", base),
            )
        add(
            table,
            f"IAC best of the Table 2/3 methods ({label})",
            _margin_best(paper, table, "iac"),
            _margin_best(ours, table, "iac"),
        )
    add(
        "table4",
        "DAPO+IAC+DLC best in Table 4",
        _margin_best(paper, "table4", "dapo_iac_dlc"),
        _margin_best(ours, "table4", "dapo_iac_dlc"),
    )
    for a, b, text in (
        ("dapo_iac", "dapo", "DAPO+IAC above DAPO"),
        ("iac", "dapo", "IAC alone above DAPO"),
        ("dapo_iac_dlc", "dapo_iac", "DLC adds to DAPO+IAC"),
    ):
        add("table4", text, _diffs(paper, "table4", a, b), _diffs(ours, "table4", a, b))
    for a, b, text in (
        ("iac", "grpo", "alpha = 1 above alpha = 0 (GRPO)"),
        ("filter", "grpo", "Filtering above GRPO"),
        ("iac", "filter", "IAC above filtering"),
    ):
        add("table5", text, _diffs(paper, "table5", a, b), _diffs(ours, "table5", a, b))
    checks.append(_alpha_optimum(paper, ours))
    checks.append(_entropy_check(fig6))
    return [c for c in checks if c is not None]


def _alpha_optimum(paper: pd.DataFrame, ours: pd.DataFrame) -> dict | None:
    """Table 5: where alpha peaks per row; the paper's optimum is interior (alpha 1 or 1.5, never 0 or 2)."""
    from calibrl.published import load

    alpha = load()["tables"]["table5"]["alpha"]

    def optimum(frame):
        sub = frame[(frame["table"] == "table5") & frame["method"].isin(alpha)]
        if sub["method"].nunique() < 2:
            return {}
        wide = sub.pivot_table(index=["metric", "benchmark"], columns="method", values="value")
        return {k: alpha[row.idxmax()] for k, row in wide.iterrows() if (row == row.max()).sum() == 1}

    p, o = optimum(paper), optimum(ours)
    if not o:
        return None
    lo, hi = min(alpha.values()), max(alpha.values())
    interior = [lo < a < hi for a in o.values()]
    return {
        "table": "table5",
        "claim": "alpha optimum interior (0 < alpha < 2)",
        "paper": ", ".join(f"{m} {b}: {a:g}" for (m, b), a in p.items()),
        "ours": ", ".join(f"{m} {b}: {a:g}" for (m, b), a in o.items()) + f" (of alphas {sorted(set(o.values()))})",
        "holds": all(interior)
        if lo in o.values() or hi in o.values() or len(set(alpha) & set(ours["method"])) > 2
        else None,  # with only alpha 0 and 1 run, "interior" cannot be told apart from "alpha = 1 wins"
    }


def _entropy_check(fig6: pd.DataFrame) -> dict | None:
    from calibrl.published import figure6_levels

    if fig6.empty or not {"dapo", "dapo_iac"} <= set(fig6["method"]):
        return None
    levels = figure6_levels()
    last = fig6[fig6["step"] > fig6["step"].max() * 0.75].groupby("method")["entropy"].mean()
    return {
        "table": "figure6",
        "claim": "Entropy higher under DAPO+IAC than DAPO (last quarter of training)",
        "paper": f"dapo_iac {levels['dapo_iac']['low']:.2f}-{levels['dapo_iac']['high']:.2f} vs dapo about "
        f"{levels['dapo']['settles_at']:.2f} nats",
        "ours": f"dapo_iac {last['dapo_iac']:.3f} vs dapo {last['dapo']:.3f} nats",
        "holds": bool(last["dapo_iac"] > last["dapo"]),
    }


def _cell(ours: float, paper: float, mark: str) -> str:
    text = "" if pd.isna(ours) else f"{ours:.2f}"
    text = f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" and text else text
    if pd.isna(paper):
        return text or "-"
    return f"{text or '-'} / {paper:.2f}" + ("" if pd.isna(ours) else f" ({ours - paper:+.2f})")


def _grid_md(frame: pd.DataFrame, table: str, value: str, mark: str, paper: str | None = None) -> list[str]:
    """One table in the paper's layout from long rows: rows (model, method) or (metric, benchmark) for Table 5."""
    sub = frame[frame["table"] == table]
    index = (
        ["metric", "benchmark"]
        if table == "table5"
        else ["metric", "method"]
        if table == "table4"
        else ["model", "method"]
    )
    column = "method" if table == "table5" else "benchmark"
    cols = list(dict.fromkeys(sub[column]))
    lines = ["| " + " | ".join(index + cols) + " |", "|" + "---|" * (len(index) + len(cols))]
    for key, g in sub.groupby(index, sort=False):
        by = g.set_index(column)
        cells = [
            _cell(by.at[c, value], by.at[c, paper] if paper else float("nan"), by.at[c, mark]) if c in by.index else "-"
            for c in cols
        ]
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + " |")
    return lines


def render_beside(table: str, title: str, merged: pd.DataFrame, matched: bool, checks: list[dict]) -> str:
    lines = [f"### {title}, beside the paper", "", CELLS_NOTE if matched else ORDER_NOTE, ""]
    if matched:
        both = merged[merged["table"] == table]
        lines += _grid_md(both, table, "ours", "mark_ours", paper="paper")
        lines += ["", "Cells: ours / paper (ours - paper); our best **bold**, second <u>underlined</u>."]
    else:
        ours = merged[merged["table"] == table].dropna(subset=["ours"])
        pap = merged[merged["table"] == table].dropna(subset=["paper"])
        lines += ["Ours:", ""] + _grid_md(ours, table, "ours", "mark_ours") + [""]
        lines += ["The paper (marks as printed):", ""] + _grid_md(pap, table, "paper", "mark_paper")
    mine = [c for c in checks if c["table"] == table or (table == "table4" and c["table"] == "figure6")]
    if mine:
        lines += ["", "The paper's orderings in our numbers:", ""] + _checks_md(mine)
    return "\n".join(lines) + "\n"


def _checks_md(checks: list[dict]) -> list[str]:
    lines = ["| claim | paper | ours | holds in ours |", "|---|---|---|---|"]
    for c in checks:
        holds = {True: "yes", False: "no", None: "n/a"}[c["holds"]]
        lines.append(f"| {c['claim']} | {c['paper']} | {c['ours']} | {holds} |")
    return lines


HTML_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>
body {{font-family: sans-serif; max-width: 75em; margin: 1em auto; line-height: 1.4}}
table {{border-collapse: collapse; margin: 0.5em 0}} th, td {{border: 1px solid #bbb; padding: 2px 6px}}
td {{text-align: right}} td:first-child, td:nth-child(2) {{text-align: left}} th {{background: #eee}}
</style></head><body>
{body}
</body></html>
"""


def write_markdown(path: str | Path, text: str) -> None:
    """``path`` (Markdown) and the same page as HTML beside it (``.html``), for the Snakemake report."""
    import markdown

    path = Path(path)
    write_text(path, text)
    body = markdown.markdown(text, extensions=["tables"])
    title = next((line.lstrip("# ") for line in text.splitlines() if line.startswith("#")), path.stem)
    write_text(path.with_suffix(".html"), HTML_PAGE.format(title=title, body=body))


def write_beside(tables: dict[str, pd.DataFrame], fig6: pd.DataFrame, out_dir: str | Path, grid: dict) -> tuple:
    """``{table}_vs_paper.{md,csv}`` for every table; returns (checks, matched)."""
    from calibrl import published

    ours, paper = long_form(tables, grid), published.cells()
    merged, matched = beside_paper(ours, paper)
    checks = paper_checks(ours, paper, fig6, grid)
    avg, pas = metrics(grid).values()
    out = Path(out_dir)
    for table in tables:
        write_csv(out / f"{table}_vs_paper.csv", merged[merged["table"] == table])
        title = TITLES[table].format(avg=avg, pas=pas)
        write_markdown(out / f"{table}_vs_paper.md", render_beside(table, title, merged, matched, checks))
    return checks, matched


# ------------------------------------------------------------------------------------------ summary
def noise_table(evals: pd.DataFrame, grid: dict) -> pd.DataFrame:
    """Seed spread of the average peak for methods run with several seeds (main model)."""
    rows = []
    for metric, label in metrics(grid).items():
        for seed in sorted(evals["seed"].unique()):
            peaks = peak_table(evals, metric, seed)
            for (model, method), value in peaks["Avg."].items():
                rows.append({"metric": label, "model": model, "method": method, "seed": seed, "avg": value})
    frame = pd.DataFrame(rows)
    multi = frame.groupby(["metric", "model", "method"])["seed"].transform("nunique") > 1
    return frame[multi].pivot_table(index=["metric", "model", "method"], columns="seed", values="avg")


def render_summary(checks: list[dict], matched: bool, noise: pd.DataFrame, grid: dict) -> str:
    from calibrl.published import mark_mismatches

    lines = [
        "# Which of the paper's orderings held",
        "",
        f"Models {list(grid['models'])}, {grid['train']['steps']} steps, checkpoints every "
        f"{grid['train']['eval_every']}, G={grid['train']['group_size']}, "
        f"{grid['train']['prompts_per_step']} prompts per step; benchmarks {grid['data']['eval_splits']}. "
        "Values are peak percentages over checkpoints.",
        "",
        "## Beside the paper",
        "",
        CELLS_NOTE if matched else ORDER_NOTE,
        "Each claim is read from the paper's published numbers (`calibrl/published.yaml`) and counted over the "
        "cells (model, metric, benchmark) of its table; it holds in ours when ours has the paper's direction "
        "everywhere the paper has it everywhere, and in most cells where the paper has it in most. "
        "Tables side by side: `tables/table{2,3,4,5}_vs_paper.md`.",
        "",
        "| table | claim | paper | ours | holds in ours |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        holds = {True: "yes", False: "no", None: "n/a"}[c["holds"]]
        lines.append(f"| {c['table']} | {c['claim']} | {c['paper']} | {c['ours']} | {holds} |")
    decided = [c for c in checks if c["holds"] is not None]
    lines += ["", f"{sum(c['holds'] for c in decided)} of {len(decided)} orderings held.", ""]
    odd = mark_mismatches()
    if len(odd):
        lines += [
            f"The paper's own best/second marks disagree with its numbers in {len(odd)} cells (e.g. "
            + "; ".join(
                f"{r.table} {r.model} {r.method} {r.benchmark}: {r.value:.2f} printed {r.mark or 'unmarked'}"
                for r in odd.head(3).itertuples()
            )
            + "); the claims above use the numbers, not the marks.",
            "",
        ]
    if not noise.empty:
        lines += [
            "## Seed noise",
            "",
            "Average peak (percent) per seed for the methods run with several seeds. A difference between "
            "methods smaller than the spread between seeds is not distinguishable.",
            "",
            noise.round(2).reset_index().to_markdown(index=False),
            "",
        ]
        spread = noise.max(axis=1) - noise.min(axis=1)
        lines.append(f"Largest seed spread: {spread.max():.2f} points; mean: {spread.mean():.2f} points.")
    return "\n".join(lines) + "\n"


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
