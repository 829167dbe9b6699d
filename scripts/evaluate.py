"""Snakemake script of rule evaluate (calibrl.evaluate.evaluate_job), for each checkpoint the job covers; the run's
backend removes a checkpoint once evaluated where grid.retention says so. Guarded: grading workers re-import
__main__."""

from calibrl import grid as G
from calibrl.evaluate import evaluate_job
from calibrl.logs import setup
from calibrl.runs import marker_of

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    splits = dict(zip(p.split_names, snakemake.input.splits))
    markers = [marker_of(out) for out in snakemake.output]  # each checkpoint's own marker, beside its result
    # from the config, not params: a changed retention changes no result (calibrl.grid.retention)
    retention, backend = G.retention(snakemake.config), G.backend(snakemake.config)
    keep = retention["keep_steps"]
    release = (lambda policy, step: backend.release(policy, step, keep)) if retention["remove_evaluated"] else None
    evaluate_job(p.settings, snakemake.input.settings, markers, splits, list(snakemake.output),
                 [int(step) for step in p.steps], snakemake.threads, snakemake.resources.grading_workers,
                 release=release)  # fmt: skip
