"""Validating a workflow config before any job starts, every problem at once, each named by its dotted key and the
rules that read it; and the one place defaults live.

Three layers: the JSON schema (workflow/schemas/config.schema.yaml: types, ranges, unknown keys, required keys, and
every default; its enums of estimators, loss aggregations, KL estimators, trainers and evaluators are read from the
registries, :func:`schema`), keys the chosen backend never reads (refused where the user set them), and the cross-key
checks a schema cannot express (``calibrl.grid.problems``, with the defaults filled in). The Snakefile calls
:func:`validate` first thing, which also fills in the schema's defaults, so every later reader can take a key as it
is, and does: tests/test_defaults.py refuses a literal fallback in any read of a key the schema defaults. A key it
gives no default is optional (absent means none), and a few derive theirs from other keys, as their schema
descriptions say (``grid.models_dir`` from ``results``; a layout's ``vllm_engines`` and ``actor_gpus_per_node`` from
its kind). The analysis plan (config/plan.yaml) has no schema: its defaults are ``calibrl.analysis_plan``'s.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path

import jsonschema
import yaml

from calibrl import grid as G

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"

# Which rules read a part of the config (longest matching prefix wins), for the error message.
RULES = {
    "results": "every rule",
    "mlflow_experiment": "toy_mlflow, grid_mlflow",
    "toy": "toy_figure, toy_verdicts, toy_mlflow",
    "grid": "run_settings, train, evaluate, aggregate",
    "grid.data": "data_synthetic / data_download, and every rule reading the data",
    "grid.warmstart": "warmstart",
    "grid.models": "warmstart / download_model, run_settings, train, evaluate",
    "grid.memory_models": "warmstart / download_model, run_settings, train",
    "grid.main_model": "run_settings, train (Tables 4, 5, Figure 6)",
    "grid.train": "run_settings, train",
    "grid.eval": "evaluate",
    "grid.methods": "run_settings, train",
    "grid.tables": "train (which runs exist), aggregate",
    "grid.extra_seeds": "train",
    "grid.workers": "train, evaluate (how fast, not what)",
    "grid.chat_template": "run_settings, train, evaluate, rank_train",
    "grid.enable_thinking": "run_settings, train, evaluate, rank_train",
    "grid.train.filter_samples": "train (filtering baseline), rank_train (its paper-scale ranking)",
    "grid.models_lock": "download_model (and every job that reads a Hub model checks against it)",
    "grid.preflight": "preflight",
}


def _is_integer(checker, instance) -> bool:
    # JSON Schema counts 25.0 as an integer; these values end up in range() and in file names (s1.0).
    return isinstance(instance, int) and not isinstance(instance, bool)


# Draft 2020-12 with "integer" meaning an int written without a decimal point.
Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


class ConfigError(ValueError):
    """The config is invalid; ``problems`` holds (dotted key, what is wrong) pairs."""

    def __init__(self, problems: list[tuple[str, str]], source: str = "config"):
        self.problems = problems
        lines = [f"  {key}: {what} (rule: {rules_for(key)})" for key, what in problems]
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"invalid {source}, {len(problems)} {noun}:\n" + "\n".join(lines))


def rules_for(key: str) -> str:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RULES:
            return RULES[".".join(parts[:n])]
    return "every rule"


# --------------------------------------------------------------------------------------------- schema
def registry_enums() -> dict[str, list[str]]:
    """The schema's ``$defs`` whose values are registered in code, with the names registered now."""
    from calibrl import backends, evaluate
    from calibrl.algo.advantages import ESTIMATORS
    from calibrl.algo.dlc import IMPORTANCE
    from calibrl.algo.losses import AGGREGATIONS, KL_ESTIMATORS
    from calibrl.data.benchmarks import BENCHMARKS

    hub = {role: [k for k, spec in BENCHMARKS.items() if spec.role == role] for role in ("train", "eval")}
    return {
        "estimator": ESTIMATORS.names(),
        "loss_agg": AGGREGATIONS.names(),
        "kl_estimator": KL_ESTIMATORS.names(),
        "dlc_importance": list(IMPORTANCE),
        "trainer": backends.names(),
        "evaluator": evaluate.names(),
        "train_set": hub["train"],
        # the synthetic task's splits (train: RL's own problems), then the Hub benchmarks
        "eval_split": ["train", "test", "ood", *hub["eval"]],
    }


# libyaml's loader where PyYAML has it (the same documents, a tenth of the time: the schema is read at every
# Snakefile load), else PyYAML's own
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _schema_file(path: str) -> dict:
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_YAML_LOADER)


def schema(base: dict | str | Path | None = None, trainer: str | None = None) -> dict:
    """The config schema (``base``: a loaded schema or its file; default the workflow's) with the registries'
    names as the enums of its ``$defs`` (a formula registered after import is a valid config value at once), and
    what the backends contribute (:func:`backend_defs`) for ``trainer``."""
    return copy.deepcopy(_schema(base, trainer))


def _schema(base: dict | str | Path | None, trainer: str | None) -> dict:
    """:func:`schema`, shared, not to be changed: built once per schema file, trainer and registered names (the
    config check reads it several times per config)."""
    enums = registry_enums()
    if isinstance(base, dict):
        return _build_schema(base, trainer, enums)
    frozen = tuple((name, tuple(values)) for name, values in enums.items())
    return _built_schema(str(base or SCHEMA_PATH), trainer, frozen)


@cache
def _built_schema(path: str, trainer: str | None, enums: tuple) -> dict:
    return _build_schema(_schema_file(path), trainer, {name: list(values) for name, values in enums})


def _build_schema(loaded: dict, trainer: str | None, enums: dict[str, list[str]]) -> dict:
    out = copy.deepcopy(loaded)
    for name, values in enums.items():
        out["$defs"][name] = {**out["$defs"][name], "enum": values}
    out["$defs"].update(backend_defs(out["$defs"], trainer))
    return out


# A backend without GPU layouts reads no resources; it refuses the Hub models they belong to (its problems), which
# says more than every layout key reported unknown.
NO_LAYOUT = {"type": "object"}


def backend_defs(defs: dict, trainer: str | None) -> dict:
    """``$defs/layout`` and ``layout_overlay``: the GPU layout of backend ``trainer`` (``GpuSide.layout``, where it
    has a GPU side; None: that of the only backend with one, as where no config names a trainer); and
    ``preflight_check``: the schema's common checks and every GPU side's own (``GpuSide.preflight_checks``)."""
    from calibrl import backends

    gpus = {name: backends.get(name).gpu for name in backends.names()}
    layouts = {name: gpu.layout if gpu is not None else None for name, gpu in gpus.items()}
    if trainer is None:
        some = [layout for layout in layouts.values() if layout]
        layout = some[0] if len(some) == 1 else None
    else:
        layout = layouts.get(trainer)
    own = [c for gpu in gpus.values() if gpu is not None for c in gpu.preflight_checks()]
    checks = defs["preflight_check"]
    return {
        "layout": {**defs["layout"], **(layout["layout"] if layout else NO_LAYOUT)},
        "layout_overlay": {**defs["layout_overlay"], **(layout["overlay"] if layout else NO_LAYOUT)},
        "preflight_check": {**checks, "enum": list(dict.fromkeys([*checks["enum"], *own]))},
    }


def _trainer(config) -> str | None:
    """The trainer ``config`` names, if it names a known one (an unknown one is the schema's error to report)."""
    from calibrl import backends

    grid = config.get("grid") if isinstance(config, dict) else None
    name = grid.get("trainer") if isinstance(grid, dict) else None
    return name if name in backends.names() else None


# ------------------------------------------------------------------------------------------- defaults
def _resolve(node: dict, root: dict) -> dict:
    while "$ref" in node:
        ref = node["$ref"].removeprefix("#/").split("/")
        target = root
        for part in ref:
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def fill_defaults(instance, node: dict, root: dict):
    """Set every missing key that has a ``default`` in the schema, below ``instance`` (in place; a valid instance).
    Under ``oneOf``/``anyOf`` the branch the instance matches is followed; defaults are deep copies."""
    node = _resolve(node, root)
    for branches in ("oneOf", "anyOf"):
        for branch in node.get(branches, []):
            if Validator(_resolve(branch, root) | {"$defs": root["$defs"]}).is_valid(instance):
                fill_defaults(instance, branch, root)
                break
    for part in node.get("allOf", []):
        fill_defaults(instance, part, root)
    if not isinstance(instance, dict):
        return instance
    properties = node.get("properties", {})
    for key, sub in properties.items():
        sub = _resolve(sub, root)
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            fill_defaults(instance[key], sub, root)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        for key in instance.keys() - properties.keys():
            fill_defaults(instance[key], extra, root)
    return instance


# YAML 1.2's float (PyYAML reads YAML 1.1, where 3e-4, with no dot, is a string)
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def _number(value, node: dict):
    """``value`` as a float where it is a string written like a number and ``node`` wants a number, else None."""
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    wanted = "number" in kinds and "string" not in kinds
    return float(value) if wanted and isinstance(value, str) and _FLOAT.fullmatch(value.strip()) else None


def coerce_numbers(instance, node: dict, root: dict):
    """Read as a number every string written like one (``3e-4``) where the schema wants a number, below
    ``instance`` (in place): YAML 1.1 loaders give such strings; YAML 1.2 and the user mean a float."""
    node = _resolve(node, root)
    for part in node.get("allOf", []):
        coerce_numbers(instance, part, root)
    if isinstance(instance, list) and isinstance(node.get("items"), dict):
        items = _resolve(node["items"], root)
        for i, value in enumerate(instance):
            number = _number(value, items)
            instance[i] = number if number is not None else coerce_numbers(value, items, root)
    if not isinstance(instance, dict):
        return instance
    properties = node.get("properties", {})
    extra = node.get("additionalProperties")
    for key in list(instance):
        sub = properties.get(key, extra if isinstance(extra, dict) else None)
        if sub is None:
            continue
        sub = _resolve(sub, root)
        number = _number(instance[key], sub)
        instance[key] = number if number is not None else coerce_numbers(instance[key], sub, root)
    return instance


def filled(section: str, values: dict, base: dict | None = None) -> dict:
    """``values`` of the config object at dotted ``section`` (``grid.train``; ``*`` for any name:
    ``grid.methods.*``) with the schema's defaults filled in: settings built outside a config file, as tests do."""
    root = _schema(base, None)
    node: dict = root
    for part in section.split("."):
        node = _resolve(node, root)
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    return fill_defaults(copy.deepcopy(values), node, root)


# ----------------------------------------------------------------------------------------- validation
def _dotted(path) -> str:
    return ".".join(str(p) for p in path)


def _schema_problems(error: jsonschema.ValidationError) -> list[tuple[str, str]]:
    """One jsonschema error as (dotted key, short message) pairs."""
    where = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in allowed]
        return [(_dotted([*where, k]), f"unknown key (allowed here: {', '.join(allowed)})") for k in extra]
    if error.validator == "required":
        missing = [k for k in error.validator_value if isinstance(error.instance, dict) and k not in error.instance]
        return [(_dotted([*where, k]), "required key is missing") for k in missing]
    if error.validator in ("oneOf", "anyOf") and error.context:
        # Report the alternative the value came closest to (fewest errors), e.g. a tiny architecture with
        # one bad field rather than "not a Hub model either".
        branches: dict[int, list] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        closest = min(branches.values(), key=len)
        return [problem for sub in closest for problem in _schema_problems(sub)]
    message = error.message if len(error.message) <= 200 else error.message[:200] + "..."
    return [(_dotted(where) or "(top level)", message)]


def problems(config: dict, base: dict | str | Path | None = None) -> list[tuple[str, str]]:
    """Every problem of ``config`` (unchanged): the schema's first; if there are none, the keys its backend never
    reads, then the cross-key checks on a copy with the defaults filled in."""
    root = _schema(base, _trainer(config))
    config = coerce_numbers(copy.deepcopy(config), root, root)
    found: list[tuple[str, str]] = []
    for error in sorted(Validator(root).iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path]):
        found += _schema_problems(error)
    if found:
        return list(dict.fromkeys(found))
    # keys as the user wrote them; one at its schema default acts no differently, so a filled config passes again
    found = [(key, what) for key, what in G.ignored_keys(config["grid"]) if not _at_default(config, key, root)]
    return found + G.problems(fill_defaults(copy.deepcopy(config), root, root))


def _at_default(config: dict, dotted: str, root: dict) -> bool:
    """Whether ``config`` holds at ``dotted`` the schema's default for it (with the defaults below it filled in)."""
    node, value = root, config
    for part in dotted.split("."):
        node = _resolve(node, root).get("properties", {}).get(part)
        value = value.get(part) if isinstance(value, dict) else None
        if node is None:
            return False
    node = _resolve(node, root)
    return "default" in node and fill_defaults(copy.deepcopy(node["default"]), node, root) == value


def validate(config: dict, base: dict | str | Path | None = None, source: str = "config") -> dict:
    """Raise :class:`ConfigError` listing every problem of ``config``; otherwise fill in the schema's defaults (in
    place, as Snakemake's own validation does) and return it."""
    found = problems(config, base)
    if found:
        raise ConfigError(found, source)
    root = _schema(base, _trainer(config))
    return fill_defaults(coerce_numbers(config, root, root), root, root)


def load(paths: list[str | Path]) -> dict:
    """Config files layered as ``snakemake --configfile a b`` does (later keys deep-merged over earlier), validated,
    with the defaults filled in."""
    merged: dict = {}
    for path in paths:
        merged = _merge(merged, yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_YAML_LOADER) or {})
    return validate(merged, source=", ".join(map(str, paths)))


def _merge(base: dict, new: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in new.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
