"""A typed view of the grid config: methods, training and evaluation settings, runs and their folders.

A method is a dict of switches over one trainer (estimator, IAC alpha, DLC mu, DAPO, filtering); the
tables of the paper name methods; the runs are the union of what the tables need. The Snakefile, the
trainers and the aggregation all read the grid through these functions.

Each job reads only its slice of the config (``*_params``): the rule passes that slice as its Snakemake
params, so a changed setting reruns exactly the jobs that read it. A training run's slice also names what
its inputs were made with (data, warm start), and its ``fingerprint`` stamps every checkpoint it writes: a
checkpoint made with other settings is never resumed, and its evaluations rerun.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields

TABLES = ("table2_3", "table4", "table5", "figure6")


@dataclass(frozen=True)
class Method:
    """The switches of one method. Defaults are plain GRPO."""

    estimator: str = "grpo"
    iac_alpha: float = 0.0
    dlc_mu: float = 0.0
    dapo: bool = False
    filter_easiest: float = 0.0
    loss_agg: str = "seq-mean-token-mean"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainSettings:
    """The optimisation settings shared by every method of a grid (config ``grid.train``)."""

    steps: int
    eval_every: int
    prompts_per_step: int
    group_size: int
    lr: float
    memory_lr: float
    max_new_tokens: int
    max_prompt_len: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    kl_coef: float = 0.001
    kl_estimator: str = "k3"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dapo_clip_high: float = 0.28
    dapo_overlong_cache: int = 4
    dapo_max_gen_batches: int = 3
    ppo_minibatches: int = 2
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    filter_samples: int = 8
    dlc_importance: str = "none"  # DLC samples vs pi_theta: "none" (Algorithm 1 line 20) or "truncated" (calibrl.dlc)

    @classmethod
    def from_config(cls, train: dict) -> TrainSettings:
        return cls(**{f.name: train[f.name] for f in fields(cls) if f.name in train})


@dataclass(frozen=True)
class EvalSettings:
    """How a checkpoint is evaluated (config ``grid.eval`` plus the prompt and the sampling seed)."""

    n: int
    k: int
    temperature: float
    top_p: float
    max_new_tokens: int
    template: str
    seed: int
    evaluator: str = "local"
    chat_template: bool = False
    tensor_parallel_size: int = 1
    max_prompt_len: int = 1024
    top_k: int = 0  # 0: every token
    enable_thinking: bool = False  # Qwen3's thinking mode, through its chat template
    dtype: str = "bfloat16"  # evaluator vllm: the engine's dtype (vLLM on CPU: float32)
    enforce_eager: bool = False  # evaluator vllm: no CUDA graphs (faster start, slower decode)
    data_parallel_size: int = 1  # evaluator vllm: engines per job, each on tensor_parallel_size GPUs

    @classmethod
    def from_params(cls, params: dict) -> EvalSettings:
        """From ``eval_params``' ``settings``."""
        return cls(**params)


_RUN_PATH = re.compile(r"(?:^|/)(?P<model>[^/]+)/(?P<method>[^/]+)/s(?P<seed>\d+)(?:/|$)")


@dataclass(frozen=True)
class Run:
    model: str
    method: str
    seed: int

    @property
    def path(self) -> str:
        """The run's folder under ``{results}/runs/``; :meth:`from_path` is its inverse."""
        return f"{self.model}/{self.method}/s{self.seed}"

    @classmethod
    def from_path(cls, path: str) -> Run:
        """The run a result file belongs to, from any path below ``runs/`` (``.../runs/m/meth/s0/eval/x.json``)."""
        text = str(path).replace("\\", "/")
        tail = text.rsplit("/runs/", 1)[-1] if "/runs/" in text else text.removeprefix("runs/")
        m = _RUN_PATH.match(tail)
        if not m:
            raise ValueError(f"{path}: not inside a run folder runs/{{model}}/{{method}}/s{{seed}}/")
        return cls(m["model"], m["method"], int(m["seed"]))


def method(config: dict, name: str) -> Method:
    try:
        spec = config["grid"]["methods"][name]
    except KeyError:
        raise KeyError(f"method {name!r} is used by grid.tables but not defined under grid.methods") from None
    return Method(**spec)


def runs(config: dict) -> list[Run]:
    """Every run the config's tables need, each once, in a stable order."""
    grid = config["grid"]
    wanted: list[Run] = []
    main = grid["main_model"]
    for model in grid["models"]:
        for name in grid["tables"]["table2_3"]:
            wanted.append(Run(model, name, grid["seed"]))
    for table in ("table4", "table5", "figure6"):
        for name in grid["tables"][table]:
            wanted.append(Run(main, name, grid["seed"]))
    for name, seeds in grid.get("extra_seeds", {}).items():
        for seed in seeds:
            wanted.append(Run(main, name, seed))
    return list(dict.fromkeys(wanted))


def marker_of(eval_path: str) -> str:
    """The marker of the checkpoint an evaluation file is of: ``runs/<run>/eval/step_k.json`` ->
    ``runs/<run>/ckpt/step_k.done`` (``calibrl.checkpoints.write_marker``)."""
    head, _, name = str(eval_path).rpartition("/eval/")
    if not head or not name.endswith(".json"):
        raise ValueError(f"{eval_path}: not an evaluation file runs/<run>/eval/step_<k>.json")
    return f"{head}/ckpt/{name.removesuffix('.json')}.done"


def eval_steps(config: dict) -> list[int]:
    """The checkpoint steps that are evaluated: every ``eval_every`` steps up to ``steps``."""
    return steps_of(config["grid"]["train"])


def steps_of(train: dict) -> list[int]:
    """``eval_steps`` from the ``grid.train`` section alone (what a training job's params carry)."""
    return checkpoint_steps(train["eval_every"], train["steps"])


def checkpoint_steps(eval_every: int, up_to: int) -> list[int]:
    """The one rule for which steps have a checkpoint (and are evaluated): ``eval_every, 2 eval_every, ...``
    up to and including ``up_to``."""
    return list(range(int(eval_every), int(up_to) + 1, int(eval_every)))


def segment_ends(config: dict, run: Run) -> list[int]:
    """Where a paper-scale run's training jobs stop: every ``segment_steps`` of its layout (a multiple of
    ``eval_every``; unset: the whole run in one job) and at ``steps``. Each segment is one SLURM job that
    resumes from the previous one's checkpoint, so a run longer than a SLURM time limit still finishes."""
    steps = int(config["grid"]["train"]["steps"])
    every = int(layout_params(config, run).get("segment_steps") or steps)
    return sorted({*range(every, steps, every), steps})


def segment_of(config: dict, run: Run, step: int) -> int:
    """The end of the segment that trains checkpoint ``step``."""
    return next(end for end in segment_ends(config, run) if end >= step)


def retention(config: dict) -> dict:
    """What happens to a paper-scale run's Hugging Face checkpoints once evaluated (``grid.retention``):
    ``remove_evaluated`` (bool) and ``keep_steps`` (always kept). Read by the evaluation job from the config, not
    its params: it changes no result, and a changed param would re-evaluate checkpoints already removed."""
    spec = config["grid"].get("retention", {})
    return {
        "remove_evaluated": bool(spec.get("remove_evaluated", False)),
        "keep_steps": list(spec.get("keep_steps", [])),
    }


# ------------------------------------------------------------------------------ each job's config slice
def architecture(grid: dict, model: str) -> dict:
    """A policy or memory model's spec without its links (``memory``) and GPU layout (``resources``)."""
    archs = {**grid["models"], **grid.get("memory_models", {})}
    return {k: v for k, v in archs[model].items() if k not in ("memory", "resources")}


def data_params(grid: dict, split: str) -> dict:
    """What one data file is made from: the synthetic task's size and seed, or one Hub dataset's source."""
    data = grid["data"]
    if data["source"] == "countdown":
        return {"source": "countdown", "split": split, "rows": data["splits"][split], "seed": data["seed"]}
    key = data["train"] if split == "train" else split
    return {
        "source": "hub",
        "split": split,
        "dataset": key,
        "revision": data.get("revisions", {}).get(key),
        "local_files": data.get("local_files", {}).get(key),
        "on_error": data.get("on_error", "fail"),
    }


def warmstart_params(config: dict, model: str) -> dict:
    grid = config["grid"]
    return {
        "model": model,
        "arch": architecture(grid, model),
        "warmstart": grid["warmstart"],
        "seed": grid["seed"],
        "template": grid["prompt_template"],
        "on_error": grid["data"].get("on_error", "fail"),
        "data": data_params(grid, "train"),
    }


def train_params(config: dict, run: Run) -> dict:
    """Everything a training run's result depends on (and nothing else): its model and memory, its method,
    ``grid.train``, the prompt, the seed, and what its inputs (data, warm starts) were made with. With the
    digests of those inputs it makes the run's settings stamp (``calibrl.checkpoints.stamp``)."""
    grid = config["grid"]
    m = method(config, run.method)
    memory = grid["models"][run.model].get("memory") if m.dlc_mu > 0 else None
    local = grid["trainer"] == "local"
    # The CPU trainer's first k steps do not depend on how many follow (constant lr, data cursor from the
    # seed), so a longer run resumes the shorter one's checkpoints: its length is the train rule's own param
    # (run_length). OpenRLHF sizes its prompt stream from the step count, so there it is identity.
    train = {k: v for k, v in grid["train"].items() if k != "steps"} if local else grid["train"]
    return {
        "run": run.path,
        "trainer": grid["trainer"],
        "model": {"name": run.model, **architecture(grid, run.model)},
        "memory": {"name": memory, **architecture(grid, memory)} if memory else None,
        "method": {"name": run.method, **m.to_dict()},
        "seed": run.seed,
        "train": train,
        "template": grid["prompt_template"],
        "chat_template": bool(grid.get("chat_template")),
        "enable_thinking": bool(grid.get("enable_thinking", False)),
        "on_error": grid["data"].get("on_error", "fail"),
        "data": data_params(grid, "train"),
        "data_seed": grid["data"]["seed"],  # the order of the training queries
        "warmstart": {"settings": grid["warmstart"], "seed": grid["seed"]} if local else None,
    }


def run_length(config: dict) -> int:
    """How many steps a run trains (``grid.train.steps``): the train rule's param beside the settings stamp."""
    return int(config["grid"]["train"]["steps"])


def layout_params(config: dict, run: Run) -> dict:
    """The GPU layout of a paper-scale run (``calibrl.layout.effective``: the model's ``resources``, with their
    ``dlc`` keys for a DLC run): how it is computed, not what, so it is no part of the fingerprint."""
    from calibrl import layout

    resources = config["grid"]["models"][run.model].get("resources", {})
    return layout.effective(resources, method(config, run.method).dlc_mu > 0)


def eval_params(config: dict) -> dict:
    """How checkpoints are evaluated (the same for every run, so runs are compared on the same samples)."""
    grid = config["grid"]
    ev = grid["eval"]
    settings = EvalSettings(
        n=ev["n"],
        k=ev["k"],
        temperature=ev["temperature"],
        top_p=ev["top_p"],
        max_new_tokens=ev["max_new_tokens"],
        template=grid["prompt_template"],
        seed=grid["seed"],
        evaluator=grid["evaluator"],
        chat_template=bool(grid.get("chat_template")),
        tensor_parallel_size=int(ev.get("tensor_parallel_size", 1)),
        max_prompt_len=int(grid["train"].get("max_prompt_len", 1024)),
        top_k=int(ev.get("top_k", 0)),
        enable_thinking=bool(grid.get("enable_thinking", False)),
        **engine_settings(ev),
    )
    return {"settings": asdict(settings), "on_error": grid["data"].get("on_error", "fail")}


def engine_settings(ev: dict) -> dict:
    """How the vLLM engines of an evaluation or ranking job run (``grid.eval``): dtype, CUDA graphs, engines."""
    return {
        "dtype": str(ev.get("dtype", "bfloat16")),
        "enforce_eager": bool(ev.get("enforce_eager", False)),
        "data_parallel_size": int(ev.get("data_parallel_size", 1)),
    }


def model_path(config: dict, model: str) -> str:
    """The absolute folder a Hub model of the grid is downloaded into once, on the login node (rule
    ``download_model``, ``calibrl.model_store``), and read from by every compute job (offline):
    ``<grid.models_dir>/<org>--<name>/<revision>``; ``grid.models_dir`` defaults to ``<results>/hub_models``.
    Relative folders are taken from the working directory (the workflow's: the repo root)."""
    from pathlib import Path

    grid = config["grid"]
    spec = {**grid["models"], **grid.get("memory_models", {})}[model]
    if "hf_id" not in spec:
        raise ValueError(f"grid.models.{model}: a tiny model has no Hub folder (no hf_id)")
    root = grid.get("models_dir") or f"{config.get('results', 'results')}/hub_models"
    return str(Path(root).resolve() / spec["hf_id"].replace("/", "--") / spec.get("revision", "main"))


def download_params(config: dict, model: str) -> dict:
    """What rule ``download_model`` fetches: the Hub id, the pinned revision (None: main), the folder."""
    spec = {**config["grid"]["models"], **config["grid"].get("memory_models", {})}[model]
    return {"hf_id": spec["hf_id"], "revision": spec.get("revision"), "path": model_path(config, model)}


def rank_params(config: dict, model: str) -> dict:
    """The filtering baseline's ranking of the training queries (paper scale): the initial model sampled with
    the training settings."""
    grid = config["grid"]
    tr = grid["train"]
    return {
        "model": model_path(config, model),  # the login node's download (rule download_model), read offline
        "hf_id": grid["models"][model]["hf_id"],
        "revision": grid["models"][model].get("revision", "main"),
        "samples": tr["filter_samples"],
        "temperature": tr["temperature"],
        "top_p": tr["top_p"],
        "max_new_tokens": tr["max_new_tokens"],
        "max_prompt_len": tr.get("max_prompt_len", 1024),
        "template": grid["prompt_template"],
        "chat_template": bool(grid.get("chat_template")),
        "enable_thinking": bool(grid.get("enable_thinking", False)),
        "seed": grid["seed"],
        "tensor_parallel_size": int(grid["eval"].get("tensor_parallel_size", 1)),
        **engine_settings(grid["eval"]),
        "on_error": grid["data"].get("on_error", "fail"),
    }


def fingerprint(settings: dict) -> str:
    """A short stable hash of a settings slice (canonical JSON: key order and int/float spelling of the same
    YAML do not matter to json.dumps of the parsed values)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_keys(old, new, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two settings slices (for the log of a retrained run)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [prefix.rstrip(".") or "(all)"]


# Keys a backend never reads (dotted under grid), with why: set, they would look as if they acted.
IGNORED = {
    "trainer": {
        "openrlhf": {
            "warmstart": "Hub models are the paper's starting points (no warm start)",
            "train.dapo_max_gen_batches": "OpenRLHF's dynamic sampling refills a batch until the data run out",
        },
        "local": {
            "retention": "the CPU trainer's checkpoints are small and resumed from",
            "models_dir": "tiny models are built here, never downloaded",
        },
    },
    "evaluator": {
        "local": {
            f"eval.{k}": "an engine setting of evaluator vllm"
            for k in ("dtype", "enforce_eager", "data_parallel_size", "tensor_parallel_size")
        },
        "vllm": {"eval.per_checkpoint": "evaluator vllm always runs one job per checkpoint"},
    },
}


def ignored_keys(grid: dict) -> list[tuple[str, str]]:
    """(key, why) for each key set in ``grid`` that its trainer or evaluator does not read."""
    out = []
    for role, backends in IGNORED.items():
        for key, why in backends.get(grid[role], {}).items():
            node: object = grid
            for part in key.split("."):
                node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
            if node is not KeyError:
                out.append((f"grid.{key}", f"grid.{role} {grid[role]} does not read it ({why}); remove it"))
    train = grid["train"]
    if grid["trainer"] == "openrlhf" and train.get("ppo_minibatches", 1) != 1:
        what = "OpenRLHF runs here take one optimizer step per rollout step (train_batch_size = prompts x G): set 1"
        out.append(("grid.train.ppo_minibatches", what))
    return out


def problems(config: dict) -> list[tuple[str, str]]:
    """Cross-key checks a JSON schema cannot express, as (dotted key, what is wrong); [] when all hold.

    Run after the schema (``calibrl.config.validate``), so the keys it reads exist with the right types."""
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
            elif grid["methods"][name].get("dlc_mu", 0) > 0 and not memory:
                what = f"DLC needs a memory model, and grid.models.{grid['main_model']}.memory is not set"
                out.append((f"grid.methods.{name}.dlc_mu", what))
    for name in grid.get("extra_seeds", {}):
        if name not in grid["methods"]:
            out.append((f"grid.extra_seeds.{name}", f"method {name!r} is not defined under grid.methods"))
    data = grid["data"]
    if data["source"] == "countdown" and not data.get("splits"):
        out.append(("grid.data.splits", "required when grid.data.source is countdown"))
    if data["source"] == "hub" and not data.get("train"):
        out.append(("grid.data.train", "the Hub training set is required when grid.data.source is hub"))
    if data["source"] == "countdown" and grid["trainer"] != "local":
        out.append(("grid.data.source", "countdown goes with grid.trainer local (tiny models)"))
    for split in data["eval_splits"]:
        if data["source"] == "countdown" and split not in data.get("splits", {}):
            out.append(("grid.data.eval_splits", f"{split!r} is not one of grid.data.splits"))
    if grid.get("enable_thinking") and not grid.get("chat_template"):
        out.append(("grid.enable_thinking", "is a switch of the chat template: set grid.chat_template too"))
    if grid["trainer"] == "local" and "warmstart" not in grid:
        out.append(("grid.warmstart", "required when grid.trainer is local (tiny models are warm-started)"))
    all_models = {**grid["models"], **grid.get("memory_models", {})}
    for name, spec in all_models.items():
        kind = "models" if name in grid["models"] else "memory_models"
        if grid["trainer"] == "local" and "hf_id" in spec:
            out.append((f"grid.{kind}.{name}", "trainer local builds tiny models: give an architecture, not hf_id"))
        if grid["trainer"] == "openrlhf" and "hf_id" not in spec:
            out.append((f"grid.{kind}.{name}", "trainer openrlhf needs hf_id (a Hugging Face model)"))
        if "hidden_size" in spec and spec["hidden_size"] % spec["num_heads"]:
            what = f"{spec['hidden_size']} is not divisible by num_heads ({spec['num_heads']})"
            out.append((f"grid.{kind}.{name}.hidden_size", what))
        if "num_heads" in spec and spec["num_heads"] % spec["num_kv_heads"]:
            what = f"{spec['num_heads']} is not divisible by num_kv_heads ({spec['num_kv_heads']})"
            out.append((f"grid.{kind}.{name}.num_heads", what))
    for name in sorted(set(grid["models"]) & set(grid.get("memory_models", {}))):
        out.append((f"grid.memory_models.{name}", f"also a name under grid.models (both would write models/{name}/)"))
    for name, spec in grid["models"].items():
        if spec.get("memory") and spec["memory"] not in grid.get("memory_models", {}):
            out.append((f"grid.models.{name}.memory", f"{spec['memory']!r} is not one of grid.memory_models"))
    out += ignored_keys(grid)
    for name, spec in grid["models"].items():
        for key, lay in (
            ("resources", spec.get("resources", {})),
            ("resources.dlc", spec.get("resources", {}).get("dlc", {})),
        ):
            every = lay.get("segment_steps")
            if every and every % train["eval_every"]:
                what = f"{every} is not a multiple of grid.train.eval_every ({train['eval_every']})"
                out.append((f"grid.models.{name}.{key}.segment_steps", what + ": a segment ends on a checkpoint"))
    broken = ("grid.tables", "grid.extra_seeds", "grid.main_model", "grid.models", "grid.memory_models")
    if grid["trainer"] == "openrlhf" and not any(k.startswith(broken) for k, _ in out):  # the runs can be listed
        from calibrl import layout

        used = [(r.model, method(config, r.method)) for r in runs(config)]
        out += layout.problems(grid, [(m, layout.uses_kl(x.to_dict(), train), x.dlc_mu > 0) for m, x in used])
    return out
