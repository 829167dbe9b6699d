"""Snakemake script of rule data_download (calibrl.data.jobs.download_job)."""

from calibrl.data.jobs import download_job
from calibrl.logs import setup

if __name__ == "__main__":
    setup(snakemake.log[0])
    download_job(snakemake.params.data, snakemake.output.data, snakemake.output.manifest)
