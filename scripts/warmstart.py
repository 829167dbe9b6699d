"""Snakemake script of rule warmstart (calibrl.backends.jobs.warmstart_job: the grid's trainer makes the model), in a
fork of the job server when one serves this Snakemake (calibrl.jobserver). The trainer is read here, not a param:
a model's folder and rule belong to one trainer, so it can change nothing a finished warm start made."""

from calibrl import jobserver

if __name__ == "__main__":
    out, trainer = snakemake.output, snakemake.config["grid"]["trainer"]
    jobserver.run("calibrl.backends.jobs:warmstart_job", snakemake.log[0], trainer, snakemake.params.settings,
                  snakemake.input.sft, out.model, out.info, snakemake.threads)  # fmt: skip
