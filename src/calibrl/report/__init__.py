"""Aggregation of the grid into the paper's tables, figures and claims, read from result files only.

One module per idea: ``load`` (result files), ``tables`` (Tables 2-5, peak reporting), ``figures``,
``paper`` (beside the published numbers), ``claims`` (the plan's primary claims decided, the paper's other
orderings exploratory; the tests are ``calibrl.stats``'), ``power`` (each primary's power from results),
``sharpening`` (pass@k curves, distinct answers, entropy with bands), ``summary``, and the jobs the rules call
(``jobs``, ``mlflow_view``).
"""

from calibrl.io import write_markdown
from calibrl.report.figures import figure6, figure6_reference, palette, plot_panels
from calibrl.report.load import load_evals, load_per_problem, load_train_metrics, metrics
from calibrl.report.paper import KEYS, beside_paper, long_form, paper_checks, render_beside, write_beside
from calibrl.report.summary import noise_table, render_summary
from calibrl.report.tables import TITLES, build_tables, peak_table, to_markdown, write_tables

__all__ = [
    "KEYS",
    "TITLES",
    "beside_paper",
    "build_tables",
    "figure6",
    "figure6_reference",
    "load_evals",
    "load_per_problem",
    "load_train_metrics",
    "long_form",
    "metrics",
    "noise_table",
    "paper_checks",
    "peak_table",
    "palette",
    "plot_panels",
    "render_beside",
    "render_summary",
    "to_markdown",
    "write_beside",
    "write_markdown",
    "write_tables",
]
