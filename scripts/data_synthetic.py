"""Snakemake script of rule data_synthetic (calibrl.pipeline.data_job)."""

from calibrl.logs import setup
from calibrl.pipeline import data_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    data_job(snakemake.params.data, snakemake.output.data, snakemake.output.manifest)
