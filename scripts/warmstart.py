"""Snakemake script of rule warmstart (calibrl.backends.local.warmstart.warmstart_job)."""

from calibrl.backends.local.warmstart import warmstart_job
from calibrl.logs import setup

if __name__ == "__main__":
    setup(snakemake.log[0])
    out = snakemake.output
    warmstart_job(snakemake.params.settings, snakemake.input.train, out.model, out.info, snakemake.threads)
