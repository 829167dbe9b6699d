# Validation of the config and the helpers every rule file uses.

import inspect
import os
import re
from functools import cache

from calibrl import grid as G
from calibrl import preflight as PF
from calibrl.config import validate

# Every problem at once, each named by its key and the rules that read it (calibrl.config), before any job; then
# the schema's defaults are filled in, so every rule reads a complete config.
validate(config)

RESULTS = config["results"]
TOY_FIGURES = ["fig1", "fig2", "fig3", "fig4", "fig5"]


wildcard_constraints:
    figure="|".join(TOY_FIGURES),


def res(path):
    """A path under the results folder of this config."""
    return f"{RESULTS}/{path}"


# ---- the RLVR grid: which runs the tables need, and what the trainer (calibrl.backends) needs for each
GRID = config["grid"]
BACKEND = G.backend(config)
# A GPU backend's SLURM jobs run in its own venv (its GpuSide.venv under this checkout; scripts/cluster_env.sh build
# <trainer> makes it) unless CALIBRL_GPU_VENV names another: the jobs get the variable (sbatch --export=ALL) and
# slurm/config.yaml's precommand puts that venv's bin/ first on PATH.
GPU_VENV = G.gpu_venv(config, workflow.basedir)
if GPU_VENV:
    os.environ.update(CALIBRL_GPU_VENV=GPU_VENV)
RUNS = G.runs(config)
EVAL_STEPS = G.eval_steps(config)
# Data files under results/data/d{data seed}/: "train" plus the evaluation splits (synthetic, or Hub datasets).
SPLITS = list(dict.fromkeys(["train", *GRID["data"].get("splits", {}), *GRID["data"]["eval_splits"]]))
EVAL_SPLITS = GRID["data"]["eval_splits"]
MODELS = list(GRID["models"]) + list(GRID["memory_models"])


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS),
    method="|".join(re.escape(m) for m in GRID["methods"]),
    seed=r"\d+",
    data=r"\d+",
    step=r"\d+",
    end=r"\d+",
    split="|".join(SPLITS),


# Snakemake calls a job's input functions several times while it plans (its inputs, params, resources, the dry run's
# listing), and every evaluation of a run asks for the same segments and request: what depends on the run or the seed
# alone is computed once (the config is final once validated). At each call it also reads the function's signature
# (which of wildcards, input, output, ... to pass), which costs more than most of these functions: @signed gives it
# once, as __signature__ (PEP 362), which inspect.signature returns as is.
def signed(fn):
    fn.__signature__ = inspect.signature(fn)
    return fn


def run_of(wildcards):
    return _run(wildcards.model, wildcards.method, wildcards.seed)


@cache
def _run(model, method, seed):
    return G.Run(model, method, int(seed))


def run_dir(wildcards):
    return res(f"runs/{run_of(wildcards).path}")


# ---- params: each rule gets only the slice of the config its job reads (calibrl.grid.*_params), so a changed
# setting reruns exactly the jobs that read it. Grading workers are a resource: they change how fast a job runs,
# never its result.
WORKERS = GRID["workers"]


@signed
def data_params(wildcards):
    return G.data_params(GRID, wildcards.split, int(wildcards.data))


@signed
def warmstart_params(wildcards):
    return G.warmstart_params(config, wildcards.model, int(wildcards.data))


@signed
def eval_splits(wildcards):
    """The evaluation splits of the run's data seed (each data seed has its own problems, calibrl.grid.data_seed)."""
    return list(_eval_splits(int(wildcards.seed)))


@cache
def _eval_splits(seed):
    return tuple(res(G.data_file(config, seed, split)) for split in EVAL_SPLITS)


@signed
def train_params(wildcards):
    return G.train_params(config, run_of(wildcards))


@signed
def run_resources(wildcards):
    return G.resources(config, run_of(wildcards))


def train_request(wildcards):
    """The SLURM request (whole nodes and their GPUs) of one training job of the run (its backend's)."""
    return dict(_request(run_of(wildcards)))


@cache
def _request(run):
    return G.request(config, run)


EVAL_PARAMS = G.eval_params(config)
# Evaluation and ranking jobs: one node with the GPUs of the evaluator's engines (none for the CPU evaluator).
ENGINE_REQUEST = G.engine_request(config)
EVAL_ENV = G.evaluate.env(GRID["evaluator"])


@signed
def rank_params(wildcards):
    return G.rank_params(config, wildcards.model)


@signed
def download_params(wildcards):
    return G.download_params(config, wildcards.model)


@signed
def run_inputs(wildcards):
    """The run's input files: its training data, and what its backend trains from (a warm start or a download, the
    memory's for DLC, the filtering baseline's ranking where a job of its own makes it)."""
    return dict(_run_inputs(run_of(wildcards)))


@cache
def _run_inputs(run):
    return {name: res(path) for name, path in G.inputs(config, run).items()}


def segment_marker(run, end):
    return res(f"runs/{run.path}/ckpt/segment_{end}.done")


@signed
def previous_segment(wildcards):
    """The segment a training job resumes from ([] for the first)."""
    run, end = run_of(wildcards), int(wildcards.end)
    ends = _segment_ends(run)
    if end not in ends:
        raise ValueError(f"{run.path}: {end} is not a segment end of this run ({ends}; resources.segment_steps)")
    earlier = [e for e in ends if e < end]
    return [segment_marker(run, earlier[-1])] if earlier else []


@signed
def last_segment(wildcards):
    run = run_of(wildcards)
    return segment_marker(run, _segment_ends(run)[-1])


@signed
def trained_checkpoint(wildcards):
    """What an evaluation waits for: the training segment that makes the checkpoint (its step markers are the
    trainer's, undeclared, since a segment's steps are no wildcard)."""
    run = run_of(wildcards)
    return segment_marker(run, _segment_of(run, int(wildcards.step)))


@cache
def _segment_of(run, step):
    return G.segment_of(config, run, step)


@cache
def _segment_ends(run):
    return G.segment_ends(config, run)


@signed
def run_settings(wildcards):
    return res(f"runs/{run_of(wildcards).path}/settings.json")


def run_outputs(run, name):
    return res(f"runs/{run.path}/{name}")


# The base model (what every run of a model starts from) as step 0, once per training seed's sampling stream
BASE_EVALS = [res(f"runs/{m}/base/s{s}/eval/step_0.json") for m in GRID["models"] for s in G.base_seeds(config, m)]
ALL_EVALS = [run_outputs(r, f"eval/step_{k}.json") for r in RUNS for k in EVAL_STEPS] + BASE_EVALS
PLAN = GRID["claims"].get("plan")
ALL_METRICS = [run_outputs(r, "metrics.jsonl") for r in RUNS]


# ---- the preflight (workflow/rules/preflight.smk): one job per GPU request shape, which that shape's jobs await
PREFLIGHT = PF.shapes(config)


wildcard_constraints:
    shape="|".join(re.escape(s) for s in PREFLIGHT) or "no-gpu-jobs",


def preflight_gate(request):
    """Input function: the preflight of the job's request shape, as an ``ancient`` input: a preflight run again
    (``--forcerun preflight``) never reruns finished work. Always there, never only while the job's output is
    missing: a set of inputs that changed once the output exists reads as "Set of input files has changed" (the
    profile's rerun trigger `input`), and every finished segment would train again inside the next one's job."""

    @signed
    def gate(wildcards):
        req = request(wildcards)
        return [ancient(res(f"preflight/{PF.shape_name(req)}.json"))] if req else []

    return gate
