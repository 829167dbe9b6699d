"""Snakemake script of rule train (calibrl.pipeline.train_job; with the CPU evaluator, then evaluate_job on the
run's checkpoints). Guarded: grading workers re-import __main__."""

from calibrl.logs import setup
from calibrl.pipeline import evaluate_job, train_job

if __name__ == "__main__":
    setup(snakemake.log[0])
    inp, params = snakemake.input, snakemake.params
    train_job(
        inp.settings,
        params.run_dir,
        inp.train,
        steps=params.steps,
        # the warm starts (tiny models), or at paper scale the login node's downloads (rule download_model)
        init_info=inp.get("init") or inp.get("hub"),
        memory_info=inp.get("memory") or inp.get("hub_memory"),
        success_path=inp.get("success"),  # paper scale, filtering baseline: rank_train's success rates
        layout=params.get("layout"),
        # paper scale: this segment's last step, and the file that says it is trained
        segment=(params.end, snakemake.output[0]) if params.get("end") else None,
        threads=snakemake.threads,
        workers=snakemake.resources.grading_workers,
    )
    if params.get("evaluation"):  # INLINE_EVAL (workflow/rules/common.smk): each checkpoint's result file
        evaluate_job(
            params.evaluation,
            inp.settings,
            list(snakemake.output.markers),
            dict(zip(params.split_names, inp.splits)),
            list(snakemake.output.evals),
            [int(step) for step in params.eval_steps],
            snakemake.threads,
            snakemake.resources.grading_workers,
        )
