"""Snakemake script of rule warmstart (calibrl.backends.local.warmstart.warmstart_job), in a fork of the job server
when one serves this Snakemake (calibrl.jobserver)."""

from calibrl import jobserver

if __name__ == "__main__":
    out = snakemake.output
    jobserver.run("calibrl.backends.local.warmstart:warmstart_job", snakemake.log[0], snakemake.params.settings,
                  snakemake.input.sft, out.model, out.info, snakemake.threads)  # fmt: skip
