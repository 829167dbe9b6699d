"""Snakemake script of rule data_download (calibrl.pipeline.download_job)."""

from calibrl.logs import setup
from calibrl.pipeline import download_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    out = snakemake.output
    download_job(snakemake.params.data, snakemake.wildcards.split, out.data, out.manifest)
