"""Broad mutations of both shipped configs fail validation before any job starts, naming the mutated key.

Every leaf gets a value of the wrong type, every mapping an unknown key, every key is deleted (which must
fail exactly when the schema requires it), and a list of impossible combinations is tried; all through
``calibrl.config.validate``, the function the Snakefile calls first. A few go through `snakemake -n` to show
the wiring: a non-zero exit, the key in the message, and no job run.
"""

import copy
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake, write_config

from calibrl.config import ConfigError, rules_for, validate

SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())
CONFIGS = {
    "embedded": yaml.safe_load((REPO / "config" / "config.yaml").read_text()),
    # used on its own (--replace-workflow-config, as the SLURM profile sets)
    "paper": yaml.safe_load((REPO / "config" / "paper.yaml").read_text()),
}


def walk(node, path=()):
    """(path, value) of every node below ``node``; lists are leaves."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key), value
            yield from walk(value, (*path, key))


def get(cfg, path):
    for key in path:
        cfg = cfg[key]
    return cfg


def wrong_type(value):
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int | float):
        return "many"
    if isinstance(value, str):
        return 12345
    if isinstance(value, list):
        return 42
    return [1, 2]  # a mapping


def schema_at(path):
    """The schema node that describes ``path`` (following properties, additionalProperties and $ref), or
    None where the schema branches (oneOf) and the node is not unique."""
    node = SCHEMA
    for key in path:
        while "$ref" in node:
            node = get(SCHEMA, node["$ref"].removeprefix("#/").split("/"))
        if "oneOf" in node:
            return None
        if key in node.get("properties", {}):
            node = node["properties"][key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    while "$ref" in node:
        node = get(SCHEMA, node["$ref"].removeprefix("#/").split("/"))
    return node


def fails_naming(cfg, key):
    with pytest.raises(ConfigError) as info:
        validate(cfg, SCHEMA_PATH)
    keys = [k for k, _ in info.value.problems]
    assert any(k == key or k.startswith(key + ".") for k in keys), f"{key} not named in:\n{info.value}"
    assert key.split(".")[0] in str(info.value)
    return info.value


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_are_valid(name):
    validate(copy.deepcopy(CONFIGS[name]), SCHEMA_PATH)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_leaf_with_a_wrong_type_is_named(name):
    count = 0
    for path, value in walk(CONFIGS[name]):
        if isinstance(value, dict):
            continue
        cfg = copy.deepcopy(CONFIGS[name])
        get(cfg, path[:-1])[path[-1]] = wrong_type(value)
        fails_naming(cfg, ".".join(map(str, path)))
        count += 1
    assert count > (60 if name == "embedded" else 50)


@pytest.mark.parametrize("name", CONFIGS)
def test_an_unknown_key_at_every_level_is_named(name):
    count = 0
    for path, value in [((), CONFIGS[name]), *walk(CONFIGS[name])]:
        if not isinstance(value, dict):
            continue
        cfg = copy.deepcopy(CONFIGS[name])
        get(cfg, path)["bogus_key"] = 1  # in a map of names (methods, models): an entry of the wrong type
        fails_naming(cfg, ".".join(map(str, (*path, "bogus_key"))))
        count += 1
    assert count > 15


@pytest.mark.parametrize("name", CONFIGS)
def test_deleting_a_key_fails_exactly_when_it_is_required(name):
    required = optional = 0
    for path, _ in walk(CONFIGS[name]):
        parent = schema_at(path[:-1])
        if parent is None:
            continue
        cfg = copy.deepcopy(CONFIGS[name])
        del get(cfg, path[:-1])[path[-1]]
        if path[-1] in parent.get("required", []):
            fails_naming(cfg, ".".join(map(str, path)))
            required += 1
        else:
            try:
                validate(cfg, SCHEMA_PATH)
                optional += 1
            except ConfigError as err:  # optional for the schema, but another key refers to it
                assert any(path[-1] in what or path[-1] in key for key, what in err.problems), str(err)
    assert required > 30 and optional > 5


def combos(name):
    """(description, mutation, key that must be named)."""
    main = CONFIGS[name]["grid"]["main_model"]

    def set_(path, value):
        def apply(cfg):
            get(cfg, path[:-1])[path[-1]] = value

        return apply

    def dlc_without_memory(cfg):
        cfg["grid"]["models"][main].pop("memory")
        cfg["grid"]["methods"]["dlc"] = {"estimator": "grpo", "dlc_mu": 0.5}
        cfg["grid"]["tables"]["table4"].append("dlc")

    def unknown_in_table(cfg):
        cfg["grid"]["tables"]["table5"].append("grpo_typo")

    def memory_not_defined(cfg):
        cfg["grid"]["models"][main]["memory"] = "no-such-model"

    steps = CONFIGS[name]["grid"]["train"]["steps"]
    return [
        ("DLC without a memory model", dlc_without_memory, "grid.methods.dlc.dlc_mu"),
        ("alpha < 0", set_(("grid", "methods", "iac", "iac_alpha"), -1.0), "grid.methods.iac.iac_alpha"),
        ("mu < 0", set_(("grid", "methods", "grpo", "dlc_mu"), -0.5), "grid.methods.grpo.dlc_mu"),
        ("interval not dividing", set_(("grid", "train", "eval_every"), steps - 1), "grid.train.eval_every"),
        ("k > n", set_(("grid", "eval", "k"), 1000), "grid.eval.k"),
        ("unknown method in a table", unknown_in_table, "grid.tables.table5"),
        ("main model not a model", set_(("grid", "main_model"), "qwen3-99b"), "grid.main_model"),
        ("memory not defined", memory_not_defined, f"grid.models.{main}.memory"),
        ("filtering all", set_(("grid", "methods", "grpo", "filter_easiest"), 1.0), "grid.methods.grpo.filter_easiest"),
        ("unknown estimator", set_(("grid", "methods", "grpo", "estimator"), "ppo"), "grid.methods.grpo.estimator"),
        ("unknown trainer", set_(("grid", "trainer"), "verl"), "grid.trainer"),
        ("zero steps", set_(("grid", "train", "steps"), 0), "grid.train.steps"),
        ("bad data policy", set_(("grid", "data", "on_error"), "ignore"), "grid.data.on_error"),
        ("top_p above 1", set_(("grid", "eval", "top_p"), 1.5), "grid.eval.top_p"),
        ("extra seed of an undefined method", set_(("grid", "extra_seeds"), {"nope": [1]}), "grid.extra_seeds.nope"),
    ]


@pytest.mark.parametrize("name", CONFIGS)
def test_impossible_combinations_are_named(name):
    for what, mutate, key in combos(name):
        cfg = copy.deepcopy(CONFIGS[name])
        mutate(cfg)
        err = fails_naming(cfg, key)
        assert rules_for(key) in str(err), what


def test_trainer_and_models_must_match():
    cfg = copy.deepcopy(CONFIGS["embedded"])
    cfg["grid"]["trainer"] = "openrlhf"
    err = fails_naming(cfg, "grid.data.source")  # countdown goes with the local trainer...
    assert "trainer openrlhf needs hf_id" in str(err)  # ...and tiny models with it too: all reported at once
    paper = copy.deepcopy(CONFIGS["paper"])
    paper["grid"]["trainer"] = "local"
    fails_naming(paper, "grid.warmstart")


@pytest.mark.parametrize(
    "mutation, key",
    [
        ({"grid": {"train": {"eval_every": 7}}}, "grid.train.eval_every"),
        ({"grid": {"methods": {"iac": {"estimator": "grpo", "iac_alpha": -1}}}}, "grid.methods.iac.iac_alpha"),
        ({"toy": {"sedes": 3}}, "toy.sedes"),
    ],
)
def test_snakemake_fails_before_any_job(workflow_dir: Path, mutation, key):
    bad = write_config(workflow_dir / "bad.yaml", mutation)  # merged into config/config.yaml by Snakemake
    proc = snakemake(workflow_dir, "--cores", "1", "--configfile", str(bad), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid config" in out and key in out, out[-3000:]
    assert not (workflow_dir / "results").exists()  # nothing ran
