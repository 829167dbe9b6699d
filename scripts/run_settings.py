"""Snakemake script of rule run_settings (calibrl.pipeline.settings_job)."""

from calibrl.logs import setup
from calibrl.pipeline import settings_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    inp = snakemake.input
    settings_job(
        snakemake.params.settings,
        snakemake.output[0],
        inp.train,
        init_info=inp.get("init"),
        memory_info=inp.get("memory"),
        success_path=inp.get("success"),
    )
