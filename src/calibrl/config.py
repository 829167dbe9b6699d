"""Validating a workflow config before any job starts: every problem at once, each named by its dotted key
and the rules that read it.

Two layers: the JSON schema (workflow/schemas/config.schema.yaml: types, ranges, unknown keys, required
keys) and the cross-key checks a schema cannot express (``calibrl.grid.problems``: an evaluation interval
that does not divide the steps, DLC without a memory model, a table naming an undefined method, ...). The
Snakefile calls :func:`validate` first thing, so a bad ``--configfile`` fails before the DAG is built.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from calibrl import grid as G

# Which rules read a part of the config (longest matching prefix wins), for the error message.
RULES = {
    "results": "every rule",
    "mlflow_experiment": "toy_mlflow, grid_mlflow",
    "toy": "toy_figure, toy_verdicts, toy_mlflow",
    "grid": "run_settings, train, evaluate, aggregate",
    "grid.data": "data_synthetic / data_download, and every rule reading the data",
    "grid.warmstart": "warmstart",
    "grid.models": "warmstart, run_settings, train, evaluate",
    "grid.memory_models": "warmstart, run_settings, train",
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


def problems(config: dict, schema: dict) -> list[tuple[str, str]]:
    """Every problem of ``config``: the schema's first, then (if there are none) the cross-key checks."""
    validator = Validator(schema)
    found: list[tuple[str, str]] = []
    for error in sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path]):
        found += _schema_problems(error)
    if found:
        return list(dict.fromkeys(found))
    return G.problems(config)


def validate(config: dict, schema_path: str | Path, source: str = "config") -> None:
    """Raise :class:`ConfigError` listing every problem of ``config``; return quietly when it is valid."""
    schema = yaml.safe_load(Path(schema_path).read_text(encoding="utf-8"))
    found = problems(config, schema)
    if found:
        raise ConfigError(found, source)
