"""Snakemake script of rule rank_train (calibrl.evaluate.vllm.rank_job). Guarded: grading workers re-import __main__."""

from calibrl.evaluate.vllm import rank_job
from calibrl.logs import setup

if __name__ == "__main__":
    setup(snakemake.log[0])
    rank_job(snakemake.params.settings, snakemake.input.train, snakemake.output[0], snakemake.resources.grading_workers)
