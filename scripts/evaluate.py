"""Snakemake script of rule evaluate (calibrl.pipeline.evaluate_job). Guarded: grading workers re-import __main__."""

from calibrl.logs import setup
from calibrl.pipeline import evaluate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    splits = dict(zip(snakemake.params.split_names, snakemake.input.splits))
    evaluate_job(
        snakemake.params.grid,
        snakemake.input.marker,
        splits,
        snakemake.output[0],
        int(snakemake.wildcards.step),
        snakemake.threads,
    )
