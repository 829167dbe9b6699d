"""A typed view of the grid config (defaults filled in by ``calibrl.config``): its methods compiled, its runs, what
each rule's job reads.

A method is a bundle of switches (``grid.methods.<name>``), compiled once into a ``calibrl.spec.MethodSpec``; the
tables of the paper name methods; the runs are the union of what the tables need. What differs between trainers
(a run's input files, its segments, its SLURM request, the keys it refuses) is asked of the backend
(``calibrl.backends``), never decided here.

Each job reads only its slice of the config (``*_params``): the rule passes that slice as its Snakemake params,
so a changed setting reruns exactly the jobs that read it. A training run's slice (:func:`train_params`) holds its
compiled method, so a switch of one method reruns that method's runs only; with the digests of its input files it
makes the run's ``settings.json`` (``calibrl.checkpoints.stamp``), whose fingerprint stamps every checkpoint: a
checkpoint made with other settings is never resumed, and its evaluations rerun.
"""

from __future__ import annotations

import copy
import os
import time
from functools import cache
from pathlib import Path

from calibrl import analysis_plan, backends, evaluate
from calibrl.runs import Run, checkpoint_steps
from calibrl.spec import EvalSettings, MethodSpec, TrainSettings, compile_method

TABLES = ("table2_3", "table4", "table5", "figure6")


def backend(config: dict) -> backends.Backend:
    return _backend(config["grid"]["trainer"])


@cache
def _backend(name: str) -> backends.Backend:
    return backends.get(name)


# The last settings each method was compiled from, and its spec: the workflow asks for a run's method in every input
# function of every job, and comparing two dicts is a fraction of freezing them into a cache key.
_LAST_COMPILED: dict[str, tuple[dict, dict, MethodSpec]] = {}


def method(config: dict, name: str) -> MethodSpec:
    """Method ``name`` compiled with ``grid.train`` (``calibrl.spec.compile_method``)."""
    grid = config["grid"]
    if name not in grid["methods"]:
        raise KeyError(f"method {name!r} is used by grid.tables but not defined under grid.methods")
    switches, train = grid["methods"][name], grid["train"]
    last = _LAST_COMPILED.get(name)
    if last is not None and last[0] == switches and last[1] == train:
        return last[2]
    spec = _compiled(name, _frozen(switches), _frozen(train))
    _LAST_COMPILED[name] = (copy.deepcopy(switches), copy.deepcopy(train), spec)
    return spec


@cache
def _compiled(name: str, switches: tuple, train: tuple) -> MethodSpec:
    return compile_method(name, dict(switches), dict(train))


def _frozen(d: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def plan(config: dict) -> analysis_plan.Plan | None:
    """The analysis plan of ``grid.claims.plan`` (None when unset), loaded once per file content."""
    path = config["grid"]["claims"].get("plan")
    return _plan(path, _digest(path) or analysis_plan.digest(path)) if path else None


@cache
def _plan(path: str, sha256: str) -> analysis_plan.Plan:
    return analysis_plan.load(path)


RACY_NS = 2_000_000_000
"""A file changed this recently (ns) when hashed is hashed again at the next read (:func:`_digest`)."""
_DIGESTS: dict[tuple, str] = {}


def _digest(path: str) -> str | None:
    """``analysis_plan.digest`` of the file at ``path`` (None where there is none), hashed once per version of the
    file rather than at every read (the workflow reads the plan in every job's input functions): a version is the
    file's inode, size, modification and change times, trusted only where the file was last changed more than
    :data:`RACY_NS` before it was hashed, as git treats racily clean files, so a file rewritten within one tick of
    the file system's clock is hashed again."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if (sha := _DIGESTS.get(key)) is not None:
        return sha
    sha = analysis_plan.digest(path)
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
        _DIGESTS[key] = sha
    return sha


def runs(config: dict) -> list[Run]:
    """Every run the config's tables need, and the plan's arms on the seeds it draws, each once, in a stable order."""
    grid = config["grid"]
    wanted: list[Run] = []
    main = grid["main_model"]
    for model in grid["models"]:
        for name in grid["tables"]["table2_3"]:
            wanted.append(Run(model, name, grid["seed"]))
    for table in ("table4", "table5", "figure6"):
        for name in grid["tables"][table]:
            wanted.append(Run(main, name, grid["seed"]))
    for name, seeds in grid["extra_seeds"].items():
        for seed in seeds:
            wanted.append(Run(main, name, seed))
    if (p := plan(config)) is not None:
        wanted += [Run(main, arm, seed) for arm in sorted(p.arms()) for seed in p.seeds]
    return list(dict.fromkeys(wanted))


def data_seed(config: dict, seed: int) -> int:
    """The data seed (problems and warm start) of training seed ``seed``: the plan's for a seed it draws (each
    belongs to one data seed), else ``grid.data.seed``."""
    p = plan(config)
    return p.data_of[seed] if p is not None and seed in p.data_of else config["grid"]["data"]["seed"]


def data_file(config: dict, seed: int, split: str) -> str:
    """A split's file for training seed ``seed``, relative to the results folder: ``data/d{data seed}/{split}``."""
    return f"data/d{data_seed(config, seed)}/{split}.jsonl"


def run_specs(config: dict) -> list[tuple[Run, MethodSpec]]:
    return [(r, method(config, r.method)) for r in runs(config)]


def eval_steps(config: dict) -> list[int]:
    """The checkpoint steps that are evaluated: every ``eval_every`` steps up to ``steps``."""
    train = config["grid"]["train"]
    return checkpoint_steps(train["eval_every"], train["steps"])


def segment_ends(config: dict, run: Run) -> list[int]:
    """Where the run's training jobs stop (the backend's segments; the last is ``grid.train.steps``)."""
    return backend(config).segments(config["grid"], run, method(config, run.method))


def segment_of(config: dict, run: Run, step: int) -> int:
    """The end of the segment that trains checkpoint ``step``."""
    return next(end for end in segment_ends(config, run) if end >= step)


def request(config: dict, run: Run) -> dict:
    """What one training job of ``run`` asks SLURM for (its backend's GPU side's; {} on CPU)."""
    gpu = backend(config).gpu
    return {} if gpu is None else gpu.request(config["grid"], run, method(config, run.method))


def gpu_venv(config: dict, root: str) -> str | None:
    """The venv the grid's SLURM jobs run in: ``CALIBRL_GPU_VENV`` where set, else its backend's (``GpuSide.venv``)
    under ``root``, the checkout; None where the backend has no GPU side."""
    gpu = backend(config).gpu
    if gpu is None:
        return None
    return os.environ.get("CALIBRL_GPU_VENV") or os.path.abspath(os.path.join(root, gpu.venv))


def engine_request(config: dict) -> dict:
    """What an evaluation or ranking job asks SLURM for (the evaluator's engines; {} on CPU)."""
    return evaluate.request(config["grid"])


def inputs(config: dict, run: Run) -> dict[str, str]:
    """The run's input files, relative to the results folder: its training data and what its backend needs."""
    spec = method(config, run.method)
    d = data_seed(config, run.seed)
    return {"train": data_file(config, run.seed, "train"), **backend(config).inputs(config["grid"], run, spec, d)}


def retention(config: dict) -> dict:
    """What happens to a run's checkpoints once evaluated (``grid.retention``). Read by the evaluation job from the
    config, not its params: it changes no result, and a changed param would re-evaluate checkpoints already
    removed."""
    return config["grid"]["retention"]


# ------------------------------------------------------------------------------ each job's config slice
def architecture(grid: dict, model: str) -> dict:
    """A policy or memory model's spec without its links (``memory``) and GPU layout (``resources``)."""
    archs = {**grid["models"], **grid["memory_models"]}
    return {k: v for k, v in archs[model].items() if k not in ("memory", "resources")}


def memory_of(grid: dict, model: str) -> str | None:
    """The memory network linked to policy ``model`` (DLC), if any."""
    return grid["models"][model].get("memory")


def data_params(grid: dict, split: str, seed: int) -> dict:
    """What one data file is made from: the synthetic task's size and data seed ``seed``, or one Hub dataset's
    source (one data seed only: ``grid.data.seed``)."""
    data = grid["data"]
    if data["source"] == "countdown":
        return {"source": "countdown", "split": split, "rows": data["splits"][split], "seed": seed}
    key = data["train"] if split == "train" else split
    out = {
        "source": "hub",
        "split": split,
        "dataset": key,
        "revision": data["revisions"].get(key),
        "local_files": data["local_files"].get(key),
        "on_error": data["on_error"],
    }
    if data.get("subset"):  # only when set: the paper's data params (and files) stay as they are
        out |= {"subset": data["subset"], "seed": data["seed"]}
    return out


def warmstart_params(config: dict, model: str, data: int) -> dict:
    """A tiny model's warm start on data seed ``data``'s training problems, initialised with that seed: each data
    seed is its own problems and its own starting model."""
    grid = config["grid"]
    return {
        "model": model,
        "arch": architecture(grid, model),
        "warmstart": grid["warmstart"],
        "seed": data,
        "template": grid["prompt_template"],
        "on_error": grid["data"]["on_error"],
        "data": data_params(grid, "train", data),
    }


def plan_sha256(config: dict) -> str | None:
    """The SHA-256 of the pre-registered analysis plan's file (``grid.claims.plan``; :func:`problems` validates
    it), or None."""
    path = config["grid"]["claims"].get("plan")
    return (_digest(path) or analysis_plan.digest(path)) if path else None


def base_params(config: dict, seed: int) -> dict:
    """What rule evaluate_base's job reads: how checkpoints are evaluated, the seed whose stream it samples with
    and the plan it is evaluated under."""
    return {**eval_params(config), "seed": seed, "plan": plan_sha256(config)}


def base_seeds(config: dict, model: str) -> list[int]:
    """Every training seed of ``model``'s runs: the base model is evaluated once per seed's sampling stream."""
    return sorted({r.seed for r in runs(config) if r.model == model})


def train_params(config: dict, run: Run) -> dict:
    """Everything a training run's result depends on (and nothing else): its model and memory, its compiled method,
    the shared training settings, the prompt, the seed and how its data were made. With the digests of its input
    files it makes the run's identity (``calibrl.checkpoints.stamp``). A backend whose longer runs resume shorter
    ones leaves the run's length out (it is the train rule's target instead)."""
    grid = config["grid"]
    spec = method(config, run.method)
    memory = memory_of(grid, run.model) if spec.uses_dlc else None
    train = TrainSettings.from_config(grid["train"]).to_dict()
    if backend(config).extends_runs:
        del train["steps"]
    return {
        "run": run.path,
        "backend": grid["trainer"],
        "model": {"name": run.model, **architecture(grid, run.model)},
        "memory": {"name": memory, **architecture(grid, memory)} if memory else None,
        "method": spec.to_dict(),
        "seed": run.seed,
        "train": train,
        "template": grid["prompt_template"],
        "chat_template": grid["chat_template"],
        "enable_thinking": grid["enable_thinking"],
        "on_error": grid["data"]["on_error"],
        "data": data_params(grid, "train", data_seed(config, run.seed)),
        "data_seed": data_seed(config, run.seed),  # the order of the training queries
        # a changed analysis plan retrains: results are decided only under the plan they were made under
        **({"plan": sha} if (sha := plan_sha256(config)) else {}),
    }


def resources(config: dict, run: Run) -> dict | None:
    """How the run is laid out (its backend's GPU side's; None on CPU; no part of its identity: settings.json
    carries it beside)."""
    gpu = backend(config).gpu
    return None if gpu is None else gpu.resources(config["grid"], run, method(config, run.method))


def eval_params(config: dict) -> dict:
    """How checkpoints are evaluated (the same for every run, so runs are compared on the same samples)."""
    grid = config["grid"]
    ev = grid["eval"]
    settings = EvalSettings(
        n=ev["n"],
        k=ev["k"],
        temperature=ev["temperature"],
        top_p=ev["top_p"],
        top_k=ev["top_k"],
        max_new_tokens=ev["max_new_tokens"],
        max_prompt_len=grid["train"]["max_prompt_len"],
        template=grid["prompt_template"],
        chat_template=grid["chat_template"],
        enable_thinking=grid["enable_thinking"],
        seed=grid["seed"],
        evaluator=grid["evaluator"],
        dtype=ev["dtype"],
        enforce_eager=ev["enforce_eager"],
        tensor_parallel_size=ev["tensor_parallel_size"],
        data_parallel_size=ev["data_parallel_size"],
    )
    params = {"settings": settings.to_dict(), "on_error": grid["data"]["on_error"]}
    # Definition 2.1's measurement where the task lists every correct mode and the evaluator can teacher-force;
    # the key only there, so grids that measure nothing new keep their params (and their finished evaluations)
    if grid["data"]["source"] == "countdown" and evaluate.measures_modes(grid["evaluator"]):
        params["modes"] = True
    return params


def model_path(config: dict, model: str) -> str:
    """The absolute folder a Hub model of the grid is downloaded into once, on the login node (rule
    ``download_model``, ``calibrl.model_store``), and read from by every compute job (offline):
    ``<grid.models_dir>/<org>--<name>/<revision>``; ``grid.models_dir`` defaults to ``<results>/hub_models``.
    Relative folders are taken from the working directory (the workflow's: the repo root)."""
    grid = config["grid"]
    spec = {**grid["models"], **grid["memory_models"]}[model]
    if "hf_id" not in spec:
        raise ValueError(f"grid.models.{model}: a tiny model has no Hub folder (no hf_id)")
    root = grid.get("models_dir") or f"{config['results']}/hub_models"
    return str(Path(root).resolve() / spec["hf_id"].replace("/", "--") / spec["revision"])


def models_lock(config: dict) -> str:
    """The lock file of the Hub models' commits (``grid.models_lock``; relative: from the working directory)."""
    return str(Path(config["grid"]["models_lock"]).resolve())


def download_params(config: dict, model: str) -> dict:
    """What rule ``download_model`` fetches: the Hub id, the revision (None: main), the folder, the lock file."""
    spec = {**config["grid"]["models"], **config["grid"]["memory_models"]}[model]
    return {
        "hf_id": spec["hf_id"],
        "revision": spec["revision"],
        "path": model_path(config, model),
        "lock": models_lock(config),
    }


def rank_params(config: dict, model: str) -> dict:
    """The filtering baseline's ranking of the training queries (paper scale): the initial model sampled with the
    training settings, by vLLM's engines (rule rank_train runs ``calibrl.evaluate.vllm.rank_job``, whatever the
    evaluator)."""
    grid = config["grid"]
    tr, ev = grid["train"], grid["eval"]
    return {
        "model": model_path(config, model),  # the login node's download (rule download_model), read offline
        "hf_id": grid["models"][model]["hf_id"],
        "revision": grid["models"][model]["revision"],
        "lock": models_lock(config),
        "samples": tr["filter_samples"],
        "temperature": tr["temperature"],
        "top_p": tr["top_p"],
        "max_new_tokens": tr["max_new_tokens"],
        "max_prompt_len": tr["max_prompt_len"],
        "template": grid["prompt_template"],
        "chat_template": grid["chat_template"],
        "enable_thinking": grid["enable_thinking"],
        "seed": grid["seed"],
        **{k: ev[k] for k in ("tensor_parallel_size", "dtype", "enforce_eager", "data_parallel_size")},
        "on_error": grid["data"]["on_error"],
    }


def run_models(config: dict) -> list[str]:
    """Every model a run of the grid trains from (a DLC run's memory model included), each once."""
    out = []
    for run, spec in run_specs(config):
        out.append(run.model)
        if spec.uses_dlc:
            out.append(memory_of(config["grid"], run.model))
    return list(dict.fromkeys(out))


def model_files(config: dict) -> list[str]:
    """The model files (``init`` and ``memory``) of every run, each once: a warm start per (model, data seed) on
    the CPU backend, a download per model on a GPU backend."""
    return list(dict.fromkeys(f for r in runs(config) for k, f in inputs(config, r).items() if k in ("init", "memory")))


# --------------------------------------------------------------------------------------------- checks
def ignored_keys(grid: dict) -> list[tuple[str, str]]:
    """(key, why) for each key set in ``grid`` (as written, before defaults) that its trainer or evaluator never
    reads: set, it would look as if it acted."""
    out = []
    roles = {"trainer": backends.get(grid["trainer"]).ignored, "evaluator": evaluate.ignored(grid["evaluator"])}
    for role, ignored in roles.items():
        for key, why in ignored.items():
            node: object = grid
            for part in key.split("."):
                node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
            if node is not KeyError:
                out.append((f"grid.{key}", f"grid.{role} {grid[role]} does not read it ({why}); remove it"))
    return out


def problems(config: dict) -> list[tuple[str, str]]:
    """Cross-key checks a JSON schema cannot express, as (dotted key, what is wrong); [] when all hold. ``config``
    has passed the schema and has its defaults filled in (``calibrl.config``)."""
    grid = config["grid"]
    out: list[tuple[str, str]] = []
    train, ev = grid["train"], grid["eval"]
    if train["steps"] % train["eval_every"]:
        what = f"{train['eval_every']} does not divide grid.train.steps ({train['steps']})"
        out.append(("grid.train.eval_every", what))
    if ev["k"] > ev["n"]:
        out.append(("grid.eval.k", f"{ev['k']} is more than the samples per problem, grid.eval.n ({ev['n']})"))
    if grid["main_model"] not in grid["models"]:
        out.append(("grid.main_model", f"{grid['main_model']!r} is not one of grid.models {list(grid['models'])}"))
    memory = grid["models"].get(grid["main_model"], {}).get("memory")
    for table in TABLES:
        for name in grid["tables"][table]:
            if name not in grid["methods"]:
                out.append((f"grid.tables.{table}", f"method {name!r} is not defined under grid.methods"))
            elif method(config, name).uses_dlc and not memory:
                what = f"DLC needs a memory model, and grid.models.{grid['main_model']}.memory is not set"
                out.append((f"grid.methods.{name}.dlc_mu", what))
    for name in grid["extra_seeds"]:
        if name not in grid["methods"]:
            out.append((f"grid.extra_seeds.{name}", f"method {name!r} is not defined under grid.methods"))
    data = grid["data"]
    splits = data.get("splits")  # no default: countdown requires it, hub data has none
    if data["source"] == "countdown" and not splits:
        out.append(("grid.data.splits", "required when grid.data.source is countdown"))
    if data["source"] == "hub" and not data.get("train"):
        out.append(("grid.data.train", "the Hub training set is required when grid.data.source is hub"))
    for split in data["eval_splits"]:
        if data["source"] == "countdown" and splits and split not in splits:
            out.append(("grid.data.eval_splits", f"{split!r} is not one of grid.data.splits"))
    if grid["enable_thinking"] and not grid["chat_template"]:
        out.append(("grid.enable_thinking", "is a switch of the chat template: set grid.chat_template too"))
    all_models = {**grid["models"], **grid["memory_models"]}
    for name, spec in all_models.items():
        kind = "models" if name in grid["models"] else "memory_models"
        if "hidden_size" in spec and spec["hidden_size"] % spec["num_heads"]:
            what = f"{spec['hidden_size']} is not divisible by num_heads ({spec['num_heads']})"
            out.append((f"grid.{kind}.{name}.hidden_size", what))
        if "num_heads" in spec and spec["num_heads"] % spec["num_kv_heads"]:
            what = f"{spec['num_heads']} is not divisible by num_kv_heads ({spec['num_kv_heads']})"
            out.append((f"grid.{kind}.{name}.num_heads", what))
    for name in sorted(set(grid["models"]) & set(grid["memory_models"])):
        out.append((f"grid.memory_models.{name}", f"also a name under grid.models (both would write models/{name}/)"))
    for name, spec in grid["models"].items():
        if spec.get("memory") and spec["memory"] not in grid["memory_models"]:
            out.append((f"grid.models.{name}.memory", f"{spec['memory']!r} is not one of grid.memory_models"))
    if grid["claims"].get("plan"):
        try:
            path = grid["claims"]["plan"]
            sha = _digest(path)  # the plan the runs read, loaded once (a missing file: load's error)
            analysis_plan.check_config(_plan(path, sha) if sha else analysis_plan.load(path), grid)
        except analysis_plan.PlanError as e:
            out.append(("grid.claims.plan", str(e)))
    if "base" in grid["methods"]:
        out.append(("grid.methods.base", "the name of the base model's arm (calibrl.analysis_plan.BASE); rename it"))
    listable = not any(k.startswith(("grid.tables", "grid.extra_seeds", "grid.main_model", "grid.models",
                                     "grid.memory_models", "grid.claims.plan")) for k, _ in out)  # fmt: skip
    specs = run_specs(config) if listable else []
    return out + backend(config).problems(grid, specs)
