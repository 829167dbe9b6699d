"""Snakemake script of rule evaluate (calibrl.pipeline.evaluate_job), for each checkpoint the job covers.

Guarded: grading workers re-import __main__."""

from calibrl.logs import setup
from calibrl.pipeline import evaluate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    splits = dict(zip(snakemake.params.split_names, snakemake.input.splits))
    markers = snakemake.input.markers
    markers = [markers] if isinstance(markers, str) else list(markers)
    for marker, out, step in zip(markers, snakemake.output, snakemake.params.steps, strict=True):
        evaluate_job(snakemake.params.grid, marker, splits, out, int(step), snakemake.threads)
