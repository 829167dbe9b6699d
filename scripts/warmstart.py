"""Snakemake script of rule warmstart (calibrl.pipeline.warmstart_job)."""

from calibrl.logs import setup
from calibrl.pipeline import warmstart_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    out = snakemake.output
    warmstart_job(snakemake.params.settings, snakemake.input.train, out.model, out.info, snakemake.threads)
