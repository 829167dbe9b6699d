"""Snakemake script of rule train: one segment of a run (calibrl.backends.jobs.train_job), in a fork of the job
server when one serves this Snakemake (calibrl.jobserver). Guarded: grading workers re-import __main__."""

from calibrl import jobserver

if __name__ == "__main__":
    p = snakemake.params
    jobserver.run("calibrl.backends.jobs:train_job", snakemake.log[0], snakemake.input.settings, p.end,
                  snakemake.output[0], snakemake.threads, snakemake.resources.grading_workers)  # fmt: skip
