"""The paper's published numbers (Tables 2-5, Figure 6's entropy levels), loaded from ``published.yaml``.

The YAML mirrors the paper's row layout so it can be checked against the PDF by eye; ``cells()`` turns it
into one row per number: (table, model, method, benchmark, metric, value, mark).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import pandas as pd
import yaml

DATA = "published.yaml"
COLUMNS = ["table", "model", "method", "benchmark", "metric", "value", "mark"]


@cache
def load() -> dict:
    """The raw YAML (package data, so it is found from an installed package too)."""
    return yaml.safe_load(files("calibrl").joinpath(DATA).read_text(encoding="utf-8"))


def cells() -> pd.DataFrame:
    """Every published number with its table and cell; ``mark`` is 'best', 'second' or '' as printed."""
    out = []
    for table, spec in load()["tables"].items():
        cols = spec["columns"]
        for i, row in enumerate(spec["rows"]):
            if len(row["values"]) != len(cols):
                raise ValueError(
                    f"{DATA}: tables.{table}.rows[{i}] has {len(row['values'])} values for {len(cols)} columns"
                )
            for col, value in zip(cols, row["values"]):
                mark = "best" if col in row.get("best", ()) else "second" if col in row.get("second", ()) else ""
                # Table 5's columns are methods and its rows benchmarks; the others the other way round.
                method, bench = (col, row["benchmark"]) if table == "table5" else (row["method"], col)
                metric = row.get("metric", spec.get("metric"))
                out.append((table, row["model"], method, bench, metric, float(value), mark))
    return pd.DataFrame(out, columns=COLUMNS)


def figure6_levels() -> dict:
    """Figure 6's entropy levels as the text gives them: {method: {...}} (nats per token)."""
    return load()["figure6"]["levels"]


def mark_mismatches(frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Cells whose printed mark disagrees with the paper's own numbers (rank within the printed group).

    The paper ranks Tables 2/3 within each (model, benchmark), Table 4 within each (metric, benchmark) and
    Table 5 within each row (metric, benchmark). Tables 4 and 5 print only the best, so only that is checked.
    """
    frame = cells() if frame is None else frame
    used = frame.groupby("table")["mark"].agg(set)
    rows = []
    for (table, _model, _bench, _metric), g in frame.groupby(["table", "model", "benchmark", "metric"], sort=False):
        rank = g["value"].rank(ascending=False, method="min")
        for (_, cell), r in zip(g.iterrows(), rank):
            implied = "best" if r == 1 else "second" if r == 2 and "second" in used[table] else ""
            if implied != cell["mark"]:
                rows.append({**cell.to_dict(), "implied": implied})
    return pd.DataFrame(rows, columns=COLUMNS + ["implied"])
