# Validation of the config and the helpers every rule file uses.

import re
from pathlib import Path

from snakemake.utils import validate

from calibrl.config import validate as validate_config

SCHEMA = Path(workflow.basedir) / "workflow" / "schemas" / "config.schema.yaml"
# Every problem at once, each named by its key and the rules that read it (calibrl.config), before any job;
# then Snakemake's own pass over the same schema, which fills in its defaults.
validate_config(config, SCHEMA)
validate(config, schema=str(SCHEMA))

RESULTS = config["results"]
TOY_FIGURES = ["fig1", "fig2", "fig3", "fig4", "fig5"]


wildcard_constraints:
    figure="|".join(TOY_FIGURES),


def res(path):
    """A path under the results folder of this config."""
    return f"{RESULTS}/{path}"


# ---- the RLVR grid: which runs the tables need (logic in calibrl.grid) ----
from calibrl import grid as G

GRID = config["grid"]
RUNS = G.runs(config)
EVAL_STEPS = G.eval_steps(config)
# Data files under results/data/: "train" plus the evaluation splits (synthetic, or Hub datasets).
SPLITS = list(dict.fromkeys(["train", *GRID["data"].get("splits", {}), *GRID["data"]["eval_splits"]]))
LOCAL = GRID["trainer"] == "local"
# CPU trainer and CPU evaluator: the training job evaluates its run's checkpoints when it has trained them (in the
# same process, so the seconds of start-up an evaluation job pays are paid once per run). Otherwise (vLLM, or
# grid.eval.per_checkpoint) rule evaluate runs one job per checkpoint.
INLINE_EVAL = LOCAL and GRID["evaluator"] == "local" and not GRID["eval"].get("per_checkpoint", False)
EVAL_SPLITS = GRID["data"]["eval_splits"]
MODELS = list(GRID["models"]) + list(GRID.get("memory_models", {}))


wildcard_constraints:
    model="|".join(re.escape(m) for m in MODELS),
    method="|".join(re.escape(m) for m in GRID["methods"]),
    seed=r"\d+",
    step=r"\d+",
    end=r"\d+",
    split="|".join(SPLITS),


def run_of(wildcards):
    return G.Run(wildcards.model, wildcards.method, int(wildcards.seed))


def run_dir(wildcards):
    return res(f"runs/{run_of(wildcards).path}")


# ---- params: each rule gets only the slice of the config its job reads (calibrl.grid.*_params), so a
# changed setting reruns exactly the jobs that read it. Grading workers are a resource: they change how
# fast a job runs, never its result.
WORKERS = GRID.get("workers", 1)


def data_params(wildcards):
    return G.data_params(GRID, wildcards.split)


def warmstart_params(wildcards):
    return G.warmstart_params(config, wildcards.model)


def train_params(wildcards):
    return G.train_params(config, run_of(wildcards))


def layout_params(wildcards):
    return G.layout_params(config, run_of(wildcards))


def train_request(wildcards):
    """Paper scale: the SLURM request (whole nodes and their GPUs) the run's layout needs (calibrl.layout)."""
    from calibrl.layout import slurm_request

    return slurm_request(layout_params(wildcards))


EVAL_PARAMS = G.eval_params(config)
# vLLM evaluation and ranking: one node with the GPUs of its engines (grid.eval data_parallel_size x
# tensor_parallel_size); the CPU evaluator asks for none.
ENGINE_GPUS = int(GRID["eval"].get("data_parallel_size", 1)) * int(GRID["eval"].get("tensor_parallel_size", 1))
ENGINE_REQUEST = {"nodes": 1, "gres": f"gpu:{ENGINE_GPUS}"} if GRID["evaluator"] == "vllm" else {}


def rank_params(wildcards):
    return G.rank_params(config, wildcards.model)


def download_params(wildcards):
    return G.download_params(config, wildcards.model)


def train_inputs(wildcards):
    """The training data; the policy's warm start and, for DLC, the memory's (tiny models); at paper scale,
    the downloaded models (``hub.json``: their absolute folders) and the success rates the filtering baseline
    ranks its queries by."""
    inputs = {"train": res("data/train.jsonl")}
    method = G.method(config, wildcards.method)
    if LOCAL:  # tiny models are warm-started here; Hub models are the paper's starting points
        inputs["init"] = res(f"models/{wildcards.model}/init.json")
        if method.dlc_mu > 0:
            memory = GRID["models"][wildcards.model]["memory"]
            inputs["memory"] = res(f"models/{memory}/init.json")
    else:  # the login node's downloads (rule download_model), which the run reads offline
        inputs["hub"] = res(f"models/{wildcards.model}/hub.json")
        if method.dlc_mu > 0:
            inputs["hub_memory"] = res(f"models/{GRID['models'][wildcards.model]['memory']}/hub.json")
        if method.filter_easiest > 0:  # the CPU trainer ranks its own queries at step 0
            inputs["success"] = res(f"models/{wildcards.model}/train_success.json")
    return inputs


def segment_marker(run, end):
    return res(f"runs/{run.path}/ckpt/segment_{end}.done")


def previous_segment(wildcards):
    """Paper scale: the segment a training job resumes from ([] for the first)."""
    run, end = run_of(wildcards), int(wildcards.end)
    ends = G.segment_ends(config, run)
    if end not in ends:
        raise ValueError(f"{run.path}: {end} is not a segment end of this run ({ends}; resources.segment_steps)")
    earlier = [e for e in ends if e < end]
    return [segment_marker(run, earlier[-1])] if earlier else []


def last_segment(wildcards):
    run = run_of(wildcards)
    return segment_marker(run, G.segment_ends(config, run)[-1])


def trained_checkpoint(wildcards):
    """What an evaluation waits for: the checkpoint's marker (CPU trainer), or at paper scale the segment that
    trains it (its markers are the launcher's, undeclared, since a segment's steps are no wildcard)."""
    if LOCAL:
        return step_marker(wildcards)
    run = run_of(wildcards)
    return segment_marker(run, G.segment_of(config, run, int(wildcards.step)))


def step_marker(wildcards):
    return res(f"runs/{run_of(wildcards).path}/ckpt/step_{wildcards.step}.done")


def run_settings(wildcards):
    return res(f"runs/{run_of(wildcards).path}/settings.json")


def run_outputs(run, name):
    return res(f"runs/{run.path}/{name}")


ALL_EVALS = [run_outputs(r, f"eval/step_{k}.json") for r in RUNS for k in EVAL_STEPS]
ALL_METRICS = [run_outputs(r, "metrics.jsonl") for r in RUNS]
