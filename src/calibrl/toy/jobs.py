"""The toy jobs the workflow runs: one per figure, the verdicts, and the MLflow sync."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from calibrl.io import write_csv, write_json
from calibrl.logs import Progress
from calibrl.toy import verdicts as V
from calibrl.toy.figures import FACTOR_COLUMNS, FIGURES, figure_settings, read_table, run_figure
from calibrl.toy.plots import plot_figure

log = logging.getLogger("calibrl.toy")


def figure_job(figure: str, cfg: dict, seeds_csv: str, curves_csv: str, stats_csv: str, plot_png: str) -> None:
    """Simulate one figure and write its per-seed data, curves, statistics and plot."""
    total = sum(1 for _ in figure_settings(figure, cfg))
    progress = Progress(f"toy {figure}: configurations", total, log, every=2.0)
    log.info("%s: %d configurations x %d seeds x %d steps", FIGURES[figure], total, cfg["seeds"], cfg["steps"])
    traj, curves, stats = run_figure(figure, cfg, progress=lambda f: progress.update(note=str(f)))
    write_csv(seeds_csv, traj)
    write_csv(curves_csv, curves)
    write_csv(stats_csv, stats)
    plot_figure(figure, curves, plot_png)


def verdicts_job(seed_csvs: dict[str, str], cfg: dict, md_path: str, csv_path: str, claims_path: str) -> pd.DataFrame:
    """Verdicts from every seed's trajectory (each figure's ``seeds.csv.gz``, paired across configurations).
    ``csv_path``: every comparison; ``claims_path``: one row per claim in the layout of ``results/claims.csv``,
    which the aggregation reads."""
    seeds = {fig: V.per_seed(read_table(path)) for fig, path in seed_csvs.items()}
    comp = V.comparisons(seeds)
    summary = V.verdicts(comp)
    keys = (
        "steps",
        "seeds",
        "seed",
        "init",
        "estimator",
        "lr",
        "momentum",
        "iac_alpha",
        "dlc_mu",
        "memory_lr",
    )
    settings = {k: cfg[k] for k in keys}
    from calibrl.io import write_markdown  # the .md and an .html twin for the Snakemake report

    write_markdown(md_path, V.render_markdown(comp, summary, settings))
    write_csv(csv_path, comp)
    write_csv(claims_path, V.claims_rows(comp))
    for _, row in summary.iterrows():
        log.info("verdict: %s -> %s (%d/%d held)", row["statement"], row["verdict"], row["held"], row["tested"])
    return summary


def mlflow_job(
    figure_dirs: dict[str, str], verdicts_md: str, cfg: dict, store_dir: str, experiment: str, out_json: str
) -> None:
    """One MLflow run per toy configuration: parameters, seed-mean curves as step metrics, plots."""
    from calibrl.tracking import RunRecord, Store  # MLflow is heavy: import only where it is used

    store = Store(store_dir)
    run_ids = {}
    for figure, folder in figure_dirs.items():
        folder = Path(folder)
        curves = read_table(folder / "curves.csv")
        stats = read_table(folder / "stats.csv")
        factor_cols = list(FACTOR_COLUMNS)
        for _, row in stats.iterrows():
            factors = {c: row[c] for c in factor_cols if row[c] != ""}
            name = f"{figure} " + " ".join(f"{k}={v}" for k, v in factors.items())
            mask = pd.Series(True, index=curves.index)
            for c in factor_cols:
                mask &= curves[c].astype(str) == str(row[c])
            sub = curves[mask]
            metrics = [(f"{q}_mean", v, int(s)) for q, v, s in zip(sub["quantity"], sub["mean"], sub["step"])]
            summary = {k: row[k] for k in stats.columns if k not in factor_cols}
            metrics += [(f"final/{k}", float(v), 0) for k, v in summary.items() if pd.notna(v)]
            params = {
                **{k: v for k, v in cfg.items() if not isinstance(v, (dict, list))},
                **factors,
                "lr": row["lr"],
                "iac_alpha": row["iac_alpha"],
                "dlc_mu": row["dlc_mu"],
            }
            record = RunRecord(
                key=f"toy/{name}",
                name=name,
                params=params,
                tags={"figure": figure, "part": "toy", **{k: str(v) for k, v in factors.items()}},
                metrics=metrics,
                artifacts=[(folder / "plot.png", "plots"), (folder / "stats.csv", "tables")],
            )
            run_ids[name] = store.upsert(experiment, record)
    summary = RunRecord(
        key="toy/verdicts",
        name="toy verdicts",
        tags={"part": "toy"},
        artifacts=[(Path(verdicts_md), "verdicts")],
    )
    run_ids["verdicts"] = store.upsert(experiment, summary)
    write_json(out_json, {"experiment": experiment, "tracking_uri": store.uri, "runs": run_ids})
    log.info("logged %d toy runs to %s", len(run_ids), store.uri)
