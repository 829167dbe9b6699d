"""Snakemake script of rule aggregate (calibrl.pipeline.aggregate_job)."""

from pathlib import Path

from calibrl.logs import setup
from calibrl.pipeline import aggregate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    results = str(Path(snakemake.output.done).parent)  # the results folder: runs/, tables/, figures/
    evals, metrics = list(snakemake.input.evals), list(snakemake.input.metrics)
    aggregate_job(p.grid, evals, metrics, results, results, p.store, p.experiment, snakemake.output.done)
