"""Snakemake script of rule evaluate (calibrl.pipeline.evaluate_job), for each checkpoint the job covers.

Guarded: grading workers re-import __main__."""

from calibrl.logs import setup
from calibrl.pipeline import evaluate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    splits = dict(zip(p.split_names, snakemake.input.splits))
    markers = snakemake.input.markers
    markers = [markers] if isinstance(markers, str) else list(markers)
    steps = [int(step) for step in p.steps]
    evaluate_job(
        p.settings,
        snakemake.input.settings,
        markers,
        splits,
        list(snakemake.output),
        steps,
        snakemake.threads,
        snakemake.resources.grading_workers,
    )
