"""Snakemake script of rule train_metrics (paper scale: calibrl.pipeline.metrics_job)."""

from calibrl.logs import setup
from calibrl.pipeline import metrics_job

setup(snakemake.log[0])
metrics_job(snakemake.params.run_dir, snakemake.output[0])
