"""Snakemake script of rule train (calibrl.pipeline.train_job). Guarded: grading workers re-import __main__."""

from calibrl.logs import setup
from calibrl.pipeline import train_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    wc, inp = snakemake.wildcards, snakemake.input
    train_job(
        snakemake.params.grid,
        wc.model,
        wc.method,
        int(wc.seed),
        inp.train,
        inp.get("init"),  # tiny models only: the paper's Hub models need no warm start
        snakemake.params.run_dir,
        inp.get("memory"),
        snakemake.threads,
        success_path=inp.get("success"),  # paper scale, filtering baseline: rank_train's success rates
    )
