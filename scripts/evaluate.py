"""Snakemake script of rule evaluate (calibrl.backends.jobs.evaluate_job), for each checkpoint the job covers, in a
fork of the job server when one serves this Snakemake (calibrl.jobserver). Guarded: grading workers re-import
__main__."""

from calibrl import grid as G
from calibrl import jobserver
from calibrl.runs import marker_of

if __name__ == "__main__":
    p = snakemake.params
    splits = dict(zip(p.split_names, snakemake.input.splits))
    markers = [marker_of(out) for out in snakemake.output]  # each checkpoint's own marker, beside its result
    # from the config, not params: a changed retention changes no result (calibrl.grid.retention)
    retention = G.retention(snakemake.config)
    jobserver.run("calibrl.backends.jobs:evaluate_job", snakemake.log[0], p.settings, snakemake.input.settings,
                  markers, splits, list(snakemake.output), [int(step) for step in p.steps], snakemake.threads,
                  snakemake.resources.grading_workers, retention)  # fmt: skip
