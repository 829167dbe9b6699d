"""The summary page: the claims with intervals and verdicts, the paper's orderings, the seed noise."""

from __future__ import annotations

import pandas as pd

from calibrl import stats as S
from calibrl.report import claims as C
from calibrl.report.load import metrics
from calibrl.report.paper import CELLS_NOTE, ORDER_NOTE
from calibrl.report.tables import peak_table


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


def scope_notes(claims: pd.DataFrame, plan) -> list[str]:
    """Per primary, its verdict beside what it can and cannot support at scale (the plan's ``scope``, written with
    the plan, before its data)."""
    if plan is None or not (any(c.scope for c in plan.primaries) or plan.not_decided):
        return []
    verdicts = dict(zip(claims["claim"], claims["reading"].fillna(claims["verdict"])))
    lines = ["### What each verdict can and cannot support (the plan's scope notes)", ""]
    for c in plan.primaries:
        lines.append(f"- **{c.id}** ({verdicts.get(f'{c.id}: {c.claim}', 'not decided')}): {c.scope or '-'}")
    if plan.not_decided:
        lines += ["", "What the plan says, before its data, that this grid cannot decide:", ""]
        lines += [f"- **{claim}**: {why}" for claim, why in plan.not_decided]
    return [*lines, ""]


def base_section(changes: pd.DataFrame | None, held_out: list[str]) -> list[str]:
    """Each plan arm's change from the base model per split, the held-out splits first (``tables/base_changes.csv``)."""
    if changes is None or changes.empty:
        return []
    order = {split: i for i, split in enumerate([*held_out, *sorted(set(changes["split"]) - set(held_out))])}
    frame = changes.assign(at=changes["split"].map(order)).sort_values(["at", "metric", "arm"])
    lines = [
        "## Each arm against the base model (`tables/base_changes.csv`)",
        "",
        "The plan's arms at the step its primaries read, minus the base model they started from, on the plan's seeds "
        "(points, 95% interval over data seeds, unadjusted; descriptive). Held-out splits first: the training "
        f"problems (`train`) show whether RL fit what it trained on, not what it learned. Held out: {held_out}.",
        "",
        "| split | metric | arm | change | 95% CI | data seeds |",
        "|---|---|---|---|---|---|",
    ]
    for r in frame.itertuples():
        lines.append(f"| {r.split} | {r.metric} | {r.arm} | {r.estimate:+.2f} | [{r.ci_low:+.2f}, {r.ci_high:+.2f}] "
                     f"| {r.data_seeds} |")  # fmt: skip
    return [*lines, ""]


def render_summary(
    claims: pd.DataFrame,
    checks: list[dict],
    matched: bool,
    noise: pd.DataFrame,
    grid: dict,
    plan=None,
    changes: pd.DataFrame | None = None,
) -> str:
    from calibrl.published import mark_mismatches

    last = int(grid["claims"]["last_checkpoints"])
    lines = [
        "# The paper's claims in this grid",
        "",
        f"Models {list(grid['models'])}, {grid['train']['steps']} steps, checkpoints every "
        f"{grid['train']['eval_every']}, G={grid['train']['group_size']}, "
        f"{grid['train']['prompts_per_step']} prompts per step; benchmarks {grid['data']['eval_splits']}.",
        "",
        "## Claims: effect, 95% interval, verdict (`claims.csv`)",
        "",
        "Primary claims come from the pre-registered analysis plan (`grid.claims.plan`, its SHA-256 in every "
        "row of `claims.csv`): each decided by a t test on its quantity's paired differences (each training "
        "seed's arms share data order and evaluation samples), averaged per data seed: the data seed (its own "
        "problems and warm start) is the unit of replication, so the test has data seeds - 1 degrees of freedom "
        "(`df`); Holm over the primaries only, and an equivalence test (TOST) against its margin. Verdicts: "
        "**holds** (different from zero in the claimed direction, not shown smaller than the margin), "
        "**contradicted** (the same, the other way), **negligible** (different from zero, yet equivalent to no "
        "effect within the margin: smaller than the smallest effect the plan calls worth finding), **absent** "
        "(not different, and equivalent within the margin) or **inconclusive**, at a family-wise "
        f"{S.LEVEL:g}. Beside each primary's verdict, its 90% interval (the one the equivalence test reads) against "
        "the margin and the minimum-effect p (one-sided: the effect is at least the margin), unadjusted, and its "
        "reading: **holds (below the margin)** when the difference is found but its 90% interval lies inside the "
        "margin, **holds (at least the margin)** when the effect is shown at least that large, **negligible** with "
        "the side it falls on. Every other row is **exploratory**: the same "
        "paired test, unadjusted, on the per-problem metric at the last "
        f"{last} evaluated checkpoint(s) averaged over problems and splits (the paper's Avg.); Figure 6 on the "
        "training entropy of the last quarter of steps; the toy on per-seed values. Estimates are differences in "
        "percentage points (answers for distinct correct answers, nats for entropy; toy: its metric).",
        "",
        *C.render(claims),
        "",
        *scope_notes(claims, plan),
        *base_section(changes, [k for k in grid["data"]["eval_splits"] if k != "train"]),
        "## Beside the paper (peak tables, descriptive)",
        "",
        CELLS_NOTE if matched else ORDER_NOTE,
        "The tables report each cell's peak over checkpoints as the paper does (selection on the test set), so "
        "these orderings are descriptive, not tests: the claims above decide. Each ordering is read from "
        "the paper's published numbers (`calibrl/published.yaml`) and counted over the "
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
    lines += [
        "",
        f"{sum(c['holds'] for c in decided)} of {len(decided)} orderings held (in the peak tables; not a test).",
        "",
    ]
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
