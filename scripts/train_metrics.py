"""Snakemake script of rule train_metrics: the run's training metrics (calibrl.backends.jobs.metrics_job)."""

from calibrl.backends.jobs import metrics_job
from calibrl.logs import setup

setup(snakemake.log[0])
metrics_job(snakemake.input.settings, snakemake.output[0])
