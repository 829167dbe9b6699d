"""Snakemake script of rule evaluate (calibrl.pipeline.evaluate_job), for each checkpoint the job covers.

Guarded: grading workers re-import __main__."""

from calibrl import grid as G
from calibrl.logs import setup
from calibrl.pipeline import evaluate_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    splits = dict(zip(p.split_names, snakemake.input.splits))
    # each checkpoint's own marker, beside its result (the input is what trains it: marker or segment)
    markers = [G.marker_of(out) for out in snakemake.output]
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
        retention=G.retention(snakemake.config),  # from the config, not params: see calibrl.grid.retention
    )
