"""Snakemake script of rule data_synthetic (calibrl.data.jobs.data_job)."""

from calibrl.data.jobs import data_job
from calibrl.logs import setup

if __name__ == "__main__":
    setup(snakemake.log[0])
    data_job(snakemake.params.data, snakemake.output.data, snakemake.output.manifest)
