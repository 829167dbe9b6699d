"""The training grid: methods as named bundles of settings, and the (model, method, seed) runs a config asks for.

A method is a dict of switches over one trainer (estimator, IAC alpha, DLC mu, DAPO, filtering); the
tables of the paper name methods; the runs are the union of what the tables need. The Snakefile, the
trainers and the aggregation all read the grid through these functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
class Run:
    model: str
    method: str
    seed: int

    @property
    def path(self) -> str:
        return f"{self.model}/{self.method}/s{self.seed}"


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


def eval_steps(config: dict) -> list[int]:
    """The checkpoint steps that are evaluated: every ``eval_every`` steps up to ``steps``."""
    train = config["grid"]["train"]
    return list(range(train["eval_every"], train["steps"] + 1, train["eval_every"]))


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
    return out
