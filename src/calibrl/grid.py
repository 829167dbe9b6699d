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


def check(config: dict) -> None:
    """Cross-key checks a JSON schema cannot express; each error names the key."""
    grid = config["grid"]
    train = grid["train"]
    if train["steps"] % train["eval_every"]:
        raise ValueError(
            f"grid.train.eval_every ({train['eval_every']}) must divide grid.train.steps ({train['steps']})"
        )
    if grid["main_model"] not in grid["models"]:
        raise ValueError(f"grid.main_model {grid['main_model']!r} is not one of grid.models {list(grid['models'])}")
    for table in TABLES:
        for name in grid["tables"][table]:
            m = method(config, name)
            if m.dlc_mu > 0 and not grid["models"][grid["main_model"]].get("memory"):
                raise ValueError(f"grid.methods.{name} uses DLC (dlc_mu > 0) but grid.models has no memory model")
    for name in grid.get("extra_seeds", {}):
        method(config, name)
    data = grid["data"]
    if data["source"] == "countdown" and not data.get("splits"):
        raise ValueError("grid.data.splits is required when grid.data.source is countdown")
    if data["source"] == "hub" and not data.get("train"):
        raise ValueError("grid.data.train (the Hub training set) is required when grid.data.source is hub")
    if data["source"] == "countdown" and grid["trainer"] != "local":
        raise ValueError("grid.data.source countdown goes with grid.trainer local (tiny models)")
    if grid["trainer"] == "local" and "warmstart" not in grid:
        raise ValueError("grid.warmstart is required when grid.trainer is local (tiny models are warm-started)")
    all_models = {**grid["models"], **grid.get("memory_models", {})}
    for name, spec in all_models.items():
        if grid["trainer"] == "local" and "hf_id" in spec:
            raise ValueError(f"grid.models.{name}: trainer local builds tiny models; give an architecture, not hf_id")
        if grid["trainer"] == "openrlhf" and "hf_id" not in spec:
            raise ValueError(f"grid.models.{name}: trainer openrlhf needs hf_id (a Hugging Face model)")
    for name, spec in grid["models"].items():
        if spec.get("memory") and spec["memory"] not in grid.get("memory_models", {}):
            raise ValueError(f"grid.models.{name}.memory {spec['memory']!r} is not one of grid.memory_models")
