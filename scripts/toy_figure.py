"""Snakemake script of rule toy_figure: simulate one toy figure (calibrl.toy.jobs.figure_job)."""

from calibrl.logs import setup
from calibrl.toy.jobs import figure_job

setup(snakemake.log[0])
out = snakemake.output
figure_job(snakemake.wildcards.figure, snakemake.params.toy, out.seeds, out.curves, out.stats, out.plot)
