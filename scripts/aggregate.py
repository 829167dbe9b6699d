"""Snakemake script of rule aggregate: tables, claims, figures and the summary (calibrl.report.jobs), in a fork of
the job server when one serves this Snakemake (calibrl.jobserver)."""

from pathlib import Path

from calibrl import jobserver

if __name__ == "__main__":
    p = snakemake.params
    grid = {"seed": p.seed, "main_model": p.main_model, "models": p.models, "methods": p.methods, "tables": p.tables,
            "eval": p.eval, "train": p.train, "data": {"eval_splits": p.eval_splits, "source": p.source,
            "seed": p.data_seed},
            "claims": p.claims}  # fmt: skip
    results = str(Path(snakemake.output.done).parent)  # the results folder: runs/, tables/, figures/
    inp = snakemake.input
    jobserver.run("calibrl.report.jobs:aggregate_job", snakemake.log[0], grid, list(inp.evals), list(inp.metrics),
                  results, snakemake.output.done, toy_csv=inp.toy, plan_path=inp.plan or None)  # fmt: skip
