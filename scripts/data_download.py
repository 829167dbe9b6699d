"""Snakemake script of rule data_download (calibrl.pipeline.download_job)."""

from calibrl.logs import setup
from calibrl.pipeline import download_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    download_job(snakemake.params.data, snakemake.output.data, snakemake.output.manifest)
