"""Snakemake script of rules aggregate (tables, figures, summary) and grid_mlflow (the MLflow view of them)."""

from pathlib import Path

from calibrl.logs import setup
from calibrl.pipeline import _sync_grid_mlflow, aggregate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    evals, metrics = list(snakemake.input.evals), list(snakemake.input.metrics)
    if snakemake.rule == "grid_mlflow":
        results = str(Path(snakemake.output.runs).parent)
        _sync_grid_mlflow(p.grid, evals, metrics, results, results, p.store, p.experiment, snakemake.output.runs)
    else:
        results = str(Path(snakemake.output.done).parent)  # the results folder: runs/, tables/, figures/
        aggregate_job(p.grid, evals, metrics, results, results, None, None, snakemake.output.done)
