"""Snakemake script of rule train: one segment of a run (calibrl.backends.jobs.train_job). Guarded: grading workers
re-import __main__."""

from calibrl.backends.jobs import train_job
from calibrl.logs import setup

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    train_job(snakemake.input.settings, p.end, snakemake.output[0], snakemake.threads,
              snakemake.resources.grading_workers)  # fmt: skip
