"""The aggregation job (rule aggregate): tables, figures, claims and the summary, from result files only."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from calibrl import analysis_plan as AP
from calibrl.io import outputs, write_csv, write_json, write_markdown
from calibrl.report import claims as C
from calibrl.report import figures as F
from calibrl.report import load as L
from calibrl.report import paper, sharpening, summary, tables

log = logging.getLogger("calibrl.report")


def toy_claims(toy_csv: str | None) -> pd.DataFrame:
    """The toy's claims (one row each, ``results/toy/claims.csv`` of rule toy_verdicts), if given."""
    return pd.read_csv(toy_csv) if toy_csv else pd.DataFrame(columns=C.COLUMNS)


def aggregate_job(
    grid: dict,
    eval_paths: list[str],
    metric_paths: list[str],
    root: str,
    done_path: str,
    toy_csv: str | None = None,
    plan_path: str | None = None,
) -> None:
    """Tables 2-5 (peak reporting) beside the paper's, the claims (the plan's primaries decided, the rest
    exploratory; the toy's too), the over-sharpening figures, Figure 6 and the summary, under ``root``. Refuses
    result files made under another analysis plan than ``plan_path``'s."""
    out = Path(root)
    plan = AP.load(plan_path) if plan_path else None
    AP.check_records(plan, L.plans(eval_paths))
    evals = L.load_evals(eval_paths, root)
    per_problem = L.load_per_problem(eval_paths, root)
    train = L.load_train_metrics(metric_paths, root)
    tabs = tables.build_tables(evals, grid)
    tables.write_tables(tabs, out / "tables", grid)
    fig6 = F.figure6(train, grid)
    write_csv(out / "tables" / "figure6_entropy.csv", fig6)
    checks, matched = paper.write_beside(tabs, fig6, out / "tables", grid)

    claims = C.with_toy(C.grid_claims(per_problem, train, grid, plan), toy_claims(toy_csv))
    write_csv(out / "claims.csv", claims)
    for r in claims.itertuples():
        log.info("claim %s: %s (estimate %s, seeds %s)", r.claim, r.verdict, r.estimate, r.seeds)

    main = grid["main_model"]
    colors = F.palette(grid)
    figs = out / "figures"
    primaries = plan.primaries if plan else ()
    arms = list(dict.fromkeys(a for c in primaries for a in c.arms if a != AP.BASE)) or list(grid["tables"]["table4"])
    passk = sharpening.pass_at_k_curves(per_problem, main, [AP.BASE, *[m for m in ("grpo", "iac") if m in arms]])
    distinct = sharpening.over_steps(per_problem, main, "distinct", [AP.BASE, *arms])
    entropy = sharpening.entropy_over_steps(train, main)
    for name, frame in (("pass_at_k", passk), ("distinct_correct", distinct), ("entropy_bands", entropy)):
        write_csv(out / "tables" / f"{name}_{main}.csv", frame)
    F.plot_panels([(passk, f"pass@k, base model and final checkpoints ({main}), 95% interval over seeds",
                    "pass@k (%)", 100.0)], "k", figs / f"pass_at_k_{main}.png", colors)  # fmt: skip
    F.plot_panels([(distinct, f"distinct correct answers per problem ({main}), 95% interval over seeds",
                    "distinct correct answers", 1.0)], "step (0: the base model)",
                  figs / f"distinct_correct_{main}.png", colors)  # fmt: skip
    F.plot_panels([(entropy, f"training entropy, 5-step mean ({main}), 95% band over seeds",
                    "entropy (nats per token)", 1.0)], "step", figs / f"entropy_bands_{main}.png", colors)  # fmt: skip
    verdicts = dict(zip(claims["claim"], claims["verdict"]))
    decided = per_problem[per_problem["seed"].isin(plan.seeds)] if plan else per_problem  # the seeds the claims read
    panels = [
        (sharpening.over_steps(decided, main, c.metric, list(c.arms), c.factor, c.weights()),
         f"{c.id}: {c.claim}: {verdicts.get(f'{c.id}: {c.claim}', 'not decided')}", c.unit, c.scale)
        for c in primaries
    ]  # fmt: skip
    F.plot_panels(panels, "step (0: the base model)", figs / "primary_claims.png", colors)

    fig6_bands = sharpening.entropy_over_steps(train[train["method"].isin(grid["tables"]["figure6"])], main)
    F.plot_panels([(fig6_bands, "Figure 6: policy entropy (5-step mean), mean over seeds, 95% band",
                    "entropy (nats per token)", 1.0)], "training step", figs / "figure6_entropy.png", colors,
                  reference=F.figure6_reference(matched))  # fmt: skip
    for metric, label in L.metrics(grid).items():
        for model in grid["models"]:
            at = per_problem[per_problem["model"] == model]
            methods = [AP.BASE, *[m for m in grid["methods"] if m in set(at["method"])]]
            panels = [(sharpening.over_steps(at[at["split"] == split], model, metric, methods),
                       f"{label} {model}: {split}, 95% interval over seeds", f"{label} (%)", 100.0)
                      for split in grid["data"]["eval_splits"]]  # fmt: skip
            F.plot_panels(panels, "step (0: the base model)", figs / f"{metric}_{model}.png", colors)
    F.plot_panels([(sharpening.entropy_over_steps(train, model), f"policy entropy, 5-step mean: {model}",
                    "entropy (nats per token)", 1.0) for model in grid["models"]], "step",
                  figs / "entropy_all.png", colors)  # fmt: skip
    noise = summary.noise_table(evals, grid)
    changes = C.base_changes(plan, per_problem, main, tuple(L.metrics(grid))) if plan else None
    if changes is not None:
        write_csv(out / "tables" / "base_changes.csv", changes)
    write_markdown(out / "summary.md", summary.render_summary(claims, checks, matched, noise, grid, plan, changes))
    write_json(
        done_path,
        {
            "tables": [str(p) for p in outputs(out / "tables")],
            "matched_paper": matched,
            "claims": claims["verdict"].value_counts().to_dict(),
            "orderings": checks,
            # what the tables were made from (relative to the results folder): `calibrl tables` notices one gone
            "inputs": [os.path.relpath(p, root) for p in [*eval_paths, *metric_paths]],
        },
    )
