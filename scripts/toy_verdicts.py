"""Snakemake script of rule toy_verdicts: a verdict per claim of the paper (calibrl.toy.jobs.verdicts_job), in a fork
of the job server when one serves this Snakemake (calibrl.jobserver)."""

from calibrl import jobserver

if __name__ == "__main__":
    seeds = dict(zip(snakemake.params.figures, snakemake.input.seeds))
    out = snakemake.output
    jobserver.run("calibrl.toy.jobs:verdicts_job", snakemake.log[0], seeds, snakemake.params.toy, out.md, out.csv,
                  out.claims)  # fmt: skip
