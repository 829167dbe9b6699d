"""Snakemake script of rule run_settings: the run's settings.json (calibrl.checkpoints.settings_job)."""

from calibrl.checkpoints import settings_job
from calibrl.logs import setup

if __name__ == "__main__":
    setup(snakemake.log[0])
    settings_job(snakemake.params.settings, snakemake.params.resources, snakemake.output[0], dict(snakemake.input))
