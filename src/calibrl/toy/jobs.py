"""The toy jobs the workflow runs: one per figure, the verdicts, and the MLflow sync."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from calibrl.io import atomic_path, write_csv, write_json
from calibrl.logs import Progress
from calibrl.toy import verdicts as V
from calibrl.toy.figures import FACTOR_COLUMNS, FIGURES, figure_settings, read_table, run_figure
from calibrl.toy.plots import plot_figure

log = logging.getLogger("calibrl.toy")
RANGE_METRICS = ("dominance_auc", "dominance_end", "collapsed_end", "t90_median", "heldout_auc", "heldout_end")


def write_trajectories(path: str | Path, traj: pd.DataFrame) -> None:
    """Every seed's trajectory as gzipped CSV, fast: millions of rows, so Arrow's CSV writer (pandas' takes five
    times as long), probabilities as float32 (7 significant digits), gzip's fastest level."""
    import gzip

    probs = {c: traj[c].astype(np.float32) for c in traj.columns if c.startswith("p_")}
    try:  # a dependency of MLflow's
        import pyarrow as pa
        import pyarrow.csv as pa_csv
    except ImportError:  # pragma: no cover
        with atomic_path(path) as tmp:
            traj.assign(**probs).to_csv(tmp, index=False, compression={"method": "gzip", "compresslevel": 1})
        return
    table = pa.Table.from_pandas(traj.assign(**probs), preserve_index=False)
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(table, sink, pa_csv.WriteOptions(quoting_style="needed"))
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(gzip.compress(sink.getvalue().to_pybytes(), compresslevel=1))


def figure_job(
    figure: str, cfg: dict, seeds_csv: str, curves_csv: str, stats_csv: str, plot_png: str, threads: int = 1
) -> None:
    """Simulate one figure and write its per-seed data, curves, statistics and plot, on ``threads`` torch threads
    (the rule's: Snakemake runs jobs side by side, and torch's default, one per core, would contend with them)."""
    import torch

    torch.set_num_threads(max(1, int(threads)))
    total = sum(1 for _ in figure_settings(figure, cfg))
    progress = Progress(f"toy {figure}: configurations", total, log, every=2.0)
    log.info("%s: %d configurations x %d seeds x %d steps", FIGURES[figure], total, cfg["seeds"], cfg["steps"])
    traj, curves, stats = run_figure(figure, cfg, progress=lambda f: progress.update(note=str(f)))
    write_trajectories(seeds_csv, traj)
    write_csv(curves_csv, curves)
    write_csv(stats_csv, stats)
    plot_figure(figure, curves, plot_png)


def verdicts_job(seed_csvs: dict[str, str], cfg: dict, md_path: str, csv_path: str, claims_path: str) -> pd.DataFrame:
    """Verdicts from every seed's trajectory (each figure's ``seeds.csv.gz``, paired across configurations), over
    the config's learning-rate range. ``csv_path``: every comparison; ``claims_path``: one row per claim in the
    layout of ``results/claims.csv`` (exploratory rows), which the aggregation reads."""
    seeds = {fig: V.per_seed(read_table(path)) for fig, path in seed_csvs.items()}
    comp = V.comparisons(seeds)
    summary = V.verdicts(comp)
    keys = ("steps", "seeds", "seed", "record_every", "init", "estimator", "lr", "lr_scales", "momentum",
            "iac_alpha", "dlc_mu", "memory_lr")  # fmt: skip
    settings = {k: cfg[k] for k in keys if k in cfg}
    note = V.range_note(cfg)
    from calibrl.io import write_markdown  # the .md and an .html twin for the Snakemake report

    write_markdown(md_path, V.render_markdown(comp, summary, settings, note))
    write_csv(csv_path, comp)
    write_csv(claims_path, V.claims_rows(comp, note))
    for _, row in summary.iterrows():
        log.info("verdict: %s -> %s (%d/%d held; per lr: %s)", row["statement"], row["verdict"], row["held"],
                 row["tested"], row["per_lr"])  # fmt: skip
    return summary


def mlflow_job(
    figure_dirs: dict[str, str], verdicts_md: str, cfg: dict, store_dir: str, experiment: str, out_json: str
) -> None:
    """One MLflow run per toy configuration: parameters, seed-mean curves at the base learning rate as step
    metrics, the final statistics at every learning rate of the range. Each figure's plot and statistics are logged
    once, in the run "toy verdicts" (``plots/<figure>/``, ``tables/<figure>/``), not copied into each of its
    configurations' runs (72 copies of a 1.7 MB plot were three quarters of the embedded default's store)."""
    from calibrl.tracking import RunRecord, Store  # MLflow is heavy: import only where it is used

    store = Store(store_dir)
    run_ids = {}
    for figure, folder in figure_dirs.items():
        folder = Path(folder)
        curves = read_table(folder / "curves.csv")
        stats = read_table(folder / "stats.csv")
        factor_cols = [c for c in FACTOR_COLUMNS if c != "lr_scale"]
        if "lr_scale" not in stats:
            stats, curves = stats.assign(lr_scale=1.0), curves.assign(lr_scale=1.0)
        for _, rows in stats.groupby(factor_cols, sort=False, dropna=False):
            # one run per configuration: the step curves at the base learning rate (the scale nearest 1), the
            # final statistics at every learning rate of the range
            rows = rows.assign(_dist=(np.log(rows["lr_scale"].astype(float))).abs()).sort_values("lr_scale")
            row = rows.loc[rows["_dist"].idxmin()]
            factors = {c: row[c] for c in factor_cols if row[c] != ""}
            name = f"{figure} " + " ".join(f"{k}={v}" for k, v in factors.items())
            mask = curves["lr_scale"].astype(float) == float(row["lr_scale"])
            for c in factor_cols:
                mask &= curves[c].astype(str) == str(row[c])
            sub = curves[mask]
            metrics = [(f"{q}_mean", v, int(s)) for q, v, s in zip(sub["quantity"], sub["mean"], sub["step"])]
            skip = set(FACTOR_COLUMNS) | {"_dist"}
            summary = {k: row[k] for k in stats.columns if k not in skip}
            metrics += [(f"final/{k}", float(v), 0) for k, v in summary.items() if pd.notna(v)]
            for _, other in rows.iterrows():  # the verdicts' quantities at every learning rate
                tag = f"final/lr_x{float(other['lr_scale']):g}"
                metrics += [
                    (f"{tag}/{k}", float(other[k]), 0) for k in RANGE_METRICS if k in other and pd.notna(other[k])
                ]
            params = {
                **{k: v for k, v in cfg.items() if not isinstance(v, (dict, list))},
                **factors,
                "lr": row["lr"],
                "lr_scale": row["lr_scale"],
                "lr_range": ", ".join(f"{x:g}" for x in rows["lr"]),
                "iac_alpha": row["iac_alpha"],
                "dlc_mu": row["dlc_mu"],
            }
            record = RunRecord(
                key=f"toy/{name}",
                name=name,
                params=params,
                tags={"figure": figure, "part": "toy", **{k: str(v) for k, v in factors.items()}},
                metrics=metrics,
            )
            run_ids[name] = store.upsert(experiment, record)
    summary = RunRecord(
        key="toy/verdicts",
        name="toy verdicts",
        tags={"part": "toy"},
        artifacts=[(Path(verdicts_md), "verdicts")]
        + [(Path(folder) / "plot.png", f"plots/{figure}") for figure, folder in figure_dirs.items()]
        + [(Path(folder) / "stats.csv", f"tables/{figure}") for figure, folder in figure_dirs.items()],
    )
    run_ids["verdicts"] = store.upsert(experiment, summary)
    write_json(out_json, {"experiment": experiment, "tracking_uri": store.uri, "runs": run_ids})
    log.info("logged %d toy runs to %s", len(run_ids), store.uri)
