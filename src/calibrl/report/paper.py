"""Our tables beside the paper's published numbers, and the paper's orderings read in both.

These orderings count cells of the peak tables (the paper's own reporting); they are descriptive. The decisions
about the paper's claims are made in ``calibrl.report.claims`` on a pre-specified quantity, with intervals.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from calibrl.io import write_csv, write_markdown
from calibrl.report.load import metrics
from calibrl.report.tables import TITLES

KEYS = ["table", "model", "method", "benchmark", "metric"]
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
