"""Snakemake script of rule toy_figure: simulate one toy figure (calibrl.toy.jobs.figure_job), in a fork of the job
server when one serves this Snakemake (calibrl.jobserver)."""

from calibrl import jobserver

if __name__ == "__main__":
    out = snakemake.output
    jobserver.run("calibrl.toy.jobs:figure_job", snakemake.log[0], snakemake.wildcards.figure, snakemake.params.toy,
                  out.seeds, out.curves, out.stats, out.plot, snakemake.threads)  # fmt: skip
