"""Our tables beside the paper's: fed the paper's own numbers, the comparison must find them cell by cell and
find every ordering the paper shows; on a grid with other names it compares orderings only."""

import copy

import pandas as pd
from conftest import filled

from calibrl import published as P
from calibrl import report as R


def paper_grid() -> dict:
    return filled("paper")["grid"]  # as the workflow reads it: the schema's defaults filled in


def paper_as_evals(shift: dict | None = None) -> pd.DataFrame:
    """The published cells as one checkpoint's evaluation files would give them (fractions, six benchmarks)."""
    cells = P.cells()
    cells = cells[(cells["benchmark"] != "Avg.")]
    rows = {}
    for r in cells.itertuples():
        metric = {"AVG@8": "avg_at_8", "PASS@8": "pass_at_8"}[r.metric]
        value = r.value + (shift or {}).get(r.method, 0.0)
        rows[(r.model, r.method, 0, 50, r.benchmark, metric)] = value / 100
    return pd.DataFrame(
        [(*k, v) for k, v in rows.items()], columns=["model", "method", "seed", "step", "split", "metric", "value"]
    )


def test_paper_numbers_match_themselves_cell_by_cell(tmp_path):
    grid = paper_grid()
    tables = R.build_tables(paper_as_evals(), grid)
    ours = R.long_form(tables, grid)
    merged, matched = R.beside_paper(ours, P.cells())
    assert matched
    both = merged.dropna(subset=["ours", "paper"])
    # every published cell but Table 4's absent Avg. has a counterpart; our Avg. is recomputed (rounding)
    assert len(both) == len(P.cells())
    assert (both["diff"].abs() <= 0.011).all()
    checks = R.paper_checks(ours, P.cells(), pd.DataFrame(), grid)
    assert len(checks) >= 14
    for c in checks:
        assert c["holds"] is True, c  # the paper's orderings hold in the paper's numbers
    R.write_beside(tables, pd.DataFrame(), tmp_path, grid)
    md = (tmp_path / "table2_vs_paper.md").read_text()
    assert "cell by cell" in md and "| qwen3-4b | iac | **94.63** / 94.63 (+0.00)" in md
    assert "<table>" in (tmp_path / "table2_vs_paper.html").read_text()


def test_a_worse_iac_breaks_the_orderings():
    grid = paper_grid()
    tables = R.build_tables(paper_as_evals({"iac": -5.0}), grid)
    ours = R.long_form(tables, grid)
    checks = {c["claim"]: c for c in R.paper_checks(ours, P.cells(), pd.DataFrame(), grid)}
    assert checks["IAC above grpo (AVG@8)"]["holds"] is False
    assert checks["IAC alone above DAPO"]["holds"] is False
    assert checks["DAPO+IAC above DAPO"]["holds"] is True  # IAC alone moved, not DAPO+IAC
    merged, _ = R.beside_paper(ours, P.cells())
    iac = merged[(merged["method"] == "iac") & (merged["table"] == "table2") & (merged["benchmark"] != "Avg.")]
    assert (iac["diff"].round(2) == -5.0).all()


def test_other_grid_compares_orderings_only(tmp_path):
    grid = copy.deepcopy(paper_grid())
    evals = paper_as_evals().replace({"qwen3-8b": "tiny-m", "qwen3-4b": "tiny-s", "qwen3-14b": "tiny-l"})
    evals = evals.replace({"split": {"math500": "test", "olympiadbench": "ood"}})
    evals = evals[evals["split"].isin(["test", "ood"])]
    grid["models"] = {"tiny-s": {}, "tiny-m": {}, "tiny-l": {}}
    grid["main_model"] = "tiny-m"
    tables = R.build_tables(evals, grid)
    fig6 = pd.DataFrame(
        {
            "method": ["dapo", "dapo_iac"] * 4,
            "step": [1, 1, 2, 2, 3, 3, 4, 4],
            "entropy": [1.0, 1.2, 0.5, 0.9, 0.3, 0.8, 0.2, 0.7],
        }
    )
    checks, matched = R.write_beside(tables, fig6, tmp_path, grid)
    assert not matched
    md = (tmp_path / "table4_vs_paper.md").read_text()
    assert "only orderings and signs" in md and "The paper (marks as printed)" in md
    by = {c["claim"]: c for c in checks}
    assert by["DAPO+IAC+DLC best in Table 4"]["holds"] is True
    assert by["Entropy higher under DAPO+IAC than DAPO (last quarter of training)"]["holds"] is True
    csv = pd.read_csv(tmp_path / "table2_vs_paper.csv")
    assert csv["diff"].isna().all() and csv["ours"].notna().any() and csv["paper"].notna().any()
    claims = pd.DataFrame(
        [{"claim": "IAC above grpo", "role": "exploratory", "source": "table2/3", "estimate": 1.5, "ci_low": 0.5,
          "ci_high": 2.5, "seeds": 3, "p": 0.01, "p_holm": float("nan"), "verdict": "holds"}]
    )  # fmt: skip
    summary = R.render_summary(claims, checks, matched, pd.DataFrame(), grid)
    assert "only orderings and signs" in summary and "disagree with its numbers in 17 cells" in summary
    assert "| IAC above grpo | exploratory | +1.50 | [+0.50, +2.50] | - | - | 3 | 0.01 | **holds** |" in summary
    assert "exploratory: 1 holds, 0 contradicted, 0 negligible, 0 absent, 0 inconclusive." in summary


def test_avg_is_the_mean_of_the_rows_peaks_as_in_the_paper():
    """The paper's Avg. column is the mean of its row; each cell is its own peak over checkpoints (so the Avg. is
    not the peak of the per-checkpoint average when benchmarks peak at different checkpoints)."""
    rows = []
    for step, test, ood in ((25, 0.50, 0.10), (50, 0.30, 0.30)):  # test peaks at 25, ood at 50
        rows += [("m", "grpo", 0, step, "test", "avg_at_8", test), ("m", "grpo", 0, step, "ood", "avg_at_8", ood)]
    evals = pd.DataFrame(rows, columns=["model", "method", "seed", "step", "split", "metric", "value"])
    peaks = R.peak_table(evals, "avg_at_8", 0, ["test", "ood"])
    assert peaks.loc[("m", "grpo")].to_dict() == {"test": 50.0, "ood": 30.0, "Avg.": 40.0}  # not max(30, 30)
    md = R.to_markdown(peaks, "t")
    assert "Peak over checkpoints per cell (the paper's reporting" in md and "mean of the row" in md
