"""Snakemake script of rule data_synthetic (calibrl.pipeline.data_job)."""

from pathlib import Path

from calibrl.logs import setup
from calibrl.pipeline import data_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    paths = {Path(p).stem: p for p in snakemake.output if p != snakemake.output.manifest}
    data_job(snakemake.params.data, paths, snakemake.output.manifest)
