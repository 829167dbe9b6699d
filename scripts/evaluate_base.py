"""Snakemake script of rule evaluate_base (calibrl.evaluate.evaluate_base_job), in a fork of the job server when
one serves this Snakemake (calibrl.jobserver). Guarded: grading workers re-import __main__."""

from calibrl import jobserver

if __name__ == "__main__":
    p = snakemake.params
    splits = dict(zip(p.split_names, snakemake.input.splits))
    jobserver.run("calibrl.evaluate:evaluate_base_job", snakemake.log[0], p.settings, snakemake.input.model, splits,
                  snakemake.output[0], snakemake.threads, snakemake.resources.grading_workers)  # fmt: skip
