"""Snakemake script of rule aggregate: tables, claims, figures and the summary (calibrl.report.jobs)."""

from pathlib import Path

from calibrl.logs import setup
from calibrl.report.jobs import aggregate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    grid = {"seed": p.seed, "main_model": p.main_model, "models": p.models, "tables": p.tables, "eval": p.eval,
            "train": p.train, "data": {"eval_splits": p.eval_splits}, "claims": p.claims}  # fmt: skip
    results = str(Path(snakemake.output.done).parent)  # the results folder: runs/, tables/, figures/
    aggregate_job(grid, list(snakemake.input.evals), list(snakemake.input.metrics), results, snakemake.output.done,
                  toy_csv=snakemake.input.toy)  # fmt: skip
