"""Snakemake script of rule toy_mlflow: log every toy configuration to MLflow (calibrl.toy.jobs.mlflow_job)."""

from pathlib import Path

from calibrl.logs import setup
from calibrl.toy.jobs import mlflow_job

setup(snakemake.log[0])
folders = {fig: str(Path(plot).parent) for fig, plot in zip(snakemake.params.figures, snakemake.input.plots)}
mlflow_job(
    folders,
    snakemake.input.verdicts,
    snakemake.params.toy,
    snakemake.params.store,
    snakemake.params.experiment,
    snakemake.output.runs,
)
