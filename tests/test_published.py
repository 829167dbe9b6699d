"""The transcription of the paper's Tables 2-5 and Figure 6 levels (calibrl/published.yaml)."""

import pytest

from calibrl import published as P


def test_every_table_and_cell_is_there():
    cells = P.cells()
    assert cells.groupby("table").size().to_dict() == {"table2": 105, "table3": 105, "table4": 32, "table5": 24}
    assert not cells.duplicated(["table", "model", "method", "benchmark", "metric"]).any()
    assert set(cells["model"]) == {"qwen3-4b", "qwen3-8b", "qwen3-14b"}
    assert set(cells.loc[cells["table"] == "table5", "method"]) == {
        "grpo",
        "iac_a0.5",
        "iac",
        "iac_a1.5",
        "iac_a2",
        "filter",
    }
    assert cells["value"].between(0, 100).all()


@pytest.mark.parametrize(
    "table, model, method, benchmark, metric, value, mark",
    [
        ("table2", "qwen3-4b", "iac", "Avg.", "AVG@8", 64.36, "best"),
        ("table2", "qwen3-8b", "rpp", "aime24", "AVG@8", 40.68, "best"),
        ("table3", "qwen3-14b", "iac", "aime24", "PASS@8", 78.07, "best"),
        ("table3", "qwen3-14b", "drgrpo", "Avg.", "PASS@8", 77.03, ""),
        ("table4", "qwen3-8b", "dapo", "lighteval", "PASS@8", 76.62, ""),
        ("table4", "qwen3-8b", "dapo_iac", "lighteval", "PASS@8", 84.80, ""),
        ("table5", "qwen3-8b", "iac_a1.5", "olympiadbench", "AVG@8", 52.11, "best"),
        ("table5", "qwen3-8b", "filter", "math500", "PASS@8", 92.06, ""),
    ],
)
def test_cells_as_printed(table, model, method, benchmark, metric, value, mark):
    cells = P.cells().set_index(["table", "model", "method", "benchmark", "metric"])
    assert cells.loc[(table, model, method, benchmark, metric)].tolist() == [value, mark]


def test_printed_averages_are_the_mean_of_the_six_benchmarks():
    # A mistyped cell would break its row's average (the paper rounds to 2 decimals).
    cells = P.cells()
    for table in ("table2", "table3"):
        wide = cells[cells["table"] == table].pivot_table(
            index=["model", "method"], columns="benchmark", values="value"
        )
        mean = wide.drop(columns="Avg.").mean(axis=1)
        assert ((mean - wide["Avg."]).abs() < 0.011).all(), (mean - wide["Avg."]).abs().max()


def test_tables_agree_where_the_paper_repeats_a_number():
    # Table 4's IAC and Table 5's alpha 0 / alpha 1 are Tables 2/3's Qwen3-8B GRPO and IAC rows.
    c = P.cells().set_index(["table", "model", "method", "benchmark", "metric"])["value"]
    for bench in ("math500", "olympiadbench"):
        assert c["table5", "qwen3-8b", "grpo", bench, "AVG@8"] == c["table2", "qwen3-8b", "grpo", bench, "AVG@8"]
        assert c["table5", "qwen3-8b", "iac", bench, "PASS@8"] == c["table3", "qwen3-8b", "iac", bench, "PASS@8"]
    for bench in ("math500", "lighteval", "minerva", "olympiadbench"):
        assert c["table4", "qwen3-8b", "iac", bench, "AVG@8"] == c["table2", "qwen3-8b", "iac", bench, "AVG@8"]


def test_marks_disagreeing_with_the_numbers_are_listed():
    odd = P.mark_mismatches()
    # Table 2, Qwen3-14B: DrGRPO's Avg. 70.18 is underlined though Reinforce++ has 70.28.
    row = odd[(odd["table"] == "table2") & (odd["model"] == "qwen3-14b") & (odd["benchmark"] == "Avg.")]
    assert set(row["method"]) == {"rpp", "drgrpo"}
    assert odd[odd["table"].isin(["table4", "table5"])].empty


def test_figure6_levels():
    lv = P.figure6_levels()
    assert lv["dapo"]["settles_at"] == 0.08 and (lv["dapo_iac"]["low"], lv["dapo_iac"]["high"]) == (0.20, 0.24)
