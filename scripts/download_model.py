"""Snakemake script of rule download_model (calibrl.model_store.download_model_job)."""

from calibrl.logs import setup
from calibrl.model_store import download_model_job

setup(snakemake.log[0])
download_model_job(snakemake.params.model, snakemake.output[0])
