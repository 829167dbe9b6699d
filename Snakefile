# calibrl: reproduce "When Sharpening Becomes Collapse" (arXiv 2601.15609).
#
#   snakemake --cores 2             the embedded default (config/config.yaml), CPU only
#   snakemake --cores 2 --configfile .test/config.yaml    the micro grid (a minute or two; what the tests run)
#   snakemake --cores 2 toy         only the softmax experiments (Figures 1-5)
#   snakemake --report results/report.html   the self-contained report of a finished run
#
# Rules live in workflow/rules/, logic in the calibrl package (src/calibrl).

from snakemake.utils import min_version

min_version("9.0")


# The embedded default, unless config files are named on the command line: then they are the whole config
# (`--configfile config/paper.yaml` is the paper's grid, not the paper's keys merged into the default's;
# layer several with `--configfile config/config.yaml my_changes.yaml`).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


# The scheduler runs a round per job end, not rounds that multiply under Snakemake's rate limiter
# (calibrl.local_scheduling). Jobs run on this machine: a warm job server imports torch, transformers and math-verify
# once and forks a child per job, instead of each job paying ~4 s of imports (calibrl.jobserver; SLURM and conda jobs
# run on their own).
onstart:
    from calibrl.local_scheduling import unthrottle

    unthrottle(workflow)
    if workflow.local_exec and not workflow.dryrun:
        from calibrl import evaluate, jobserver

        jobserver.start((*BACKEND.preload, *evaluate.preload(GRID["evaluator"])))
    if RUNS:  # MLflow as the grid runs: each run's evaluations and training metrics as they appear (calibrl.live)
        from calibrl import live

        live.start(LIVE_SPEC, res("logs/mlflow_live.json"), res("logs/mlflow_live.log"))


onsuccess:
    from calibrl import jobserver, live

    jobserver.stop()
    live.stop()


onerror:
    from calibrl import jobserver, live

    jobserver.stop()
    live.stop()


rule all:
    default_target: True
    input:
        rules.toy.input,
        rules.aggregate.output,
        rules.grid_mlflow.output,
        MODEL_INFOS,
