"""Snakemake script of rule toy_verdicts: a verdict per claim of the paper (calibrl.toy.jobs.verdicts_job)."""

from calibrl.logs import setup
from calibrl.toy.jobs import verdicts_job

setup(snakemake.log[0])
seeds = dict(zip(snakemake.params.figures, snakemake.input.seeds))
verdicts_job(seeds, snakemake.params.toy, snakemake.output.md, snakemake.output.csv, snakemake.output.claims)
