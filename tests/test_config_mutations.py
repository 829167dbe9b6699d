"""Broad mutations of both shipped configs fail validation before any job starts, naming the mutated key.

Both shipped configs are mutated: config/config.yaml (the embedded default) and config/paper.yaml on its own
(as with ``--replace-workflow-config``, which the SLURM profile sets). Every node gets values of the wrong
type (leaves, lists, mappings; list items too), every mapping an unknown key, every key is deleted (which
must fail exactly when the schema requires it), and a list of impossible combinations is tried. The bulk goes
through ``calibrl.config.problems`` with the schema loaded once (what ``calibrl.config.validate``, the
function the Snakefile calls first, runs after reading the schema file); each problem must name the key as a
dotted path and the rules that read it. A few go through ``snakemake`` to show the wiring: a non-zero exit,
the key in the message, and no job run.
"""

import copy
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake, write_config

from calibrl.config import ConfigError, problems, rules_for, validate

SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())
CONFIGS = {
    "embedded": yaml.safe_load((REPO / "config" / "config.yaml").read_text()),
    "paper": yaml.safe_load((REPO / "config" / "paper.yaml").read_text()),
}
# Mutations checked per config and kind, printed at the end of the session (pytest -s) and bounded below.
COUNTS: dict[tuple[str, str], int] = {}


def walk(node, path=()):
    """(path, value) of every node below ``node``, mappings and lists included; list items are not walked."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key), value
            yield from walk(value, (*path, key))


def get(cfg, path):
    for key in path:
        cfg = cfg[key]
    return cfg


def dotted(path) -> str:
    return ".".join(map(str, path))


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


CANDIDATES = ("many", 12345, True, [1, 2], {"x": 1}, None)


def _kind(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def wrong_types(path, value):
    """Values of every other JSON type than ``value``'s (and a fraction where an integer is expected)."""
    out = [c for c in CANDIDATES if _kind(c) != _kind(value)]
    node = schema_at(path)  # None inside a model (oneOf), where every number is an integer
    if (node or {}).get("type") == "integer" or node is None and _kind(value) == "number":
        out.append(2.5)
    return out


def check_named(name, kind, cfg, key, full=False):
    """``cfg`` is invalid and the error names ``key`` (or a key below it) with its rules; a message if not."""
    COUNTS[name, kind] = COUNTS.get((name, kind), 0) + 1
    if full:  # the function the Snakefile calls, reading the schema file
        try:
            validate(cfg, SCHEMA_PATH)
            return f"{kind} {key}: accepted"
        except ConfigError as exc:
            err = exc
    else:
        found = problems(cfg, SCHEMA)
        if not found:
            return f"{kind} {key}: accepted"
        err = ConfigError(found)
    lines = [line for line in str(err).splitlines() if line.strip().startswith((key + ":", key + "."))]
    if not any(k == key or k.startswith(key + ".") for k, _ in err.problems) or not lines:
        return f"{kind} {key}: not named in\n{err}"
    if not all(f"(rule: {rules_for(line.split(':')[0].strip())})" in line for line in lines):
        return f"{kind} {key}: no rule named in\n{err}"
    return None


def assert_all(failures):
    assert not failures, f"{len(failures)} mutation(s) not reported as expected:\n" + "\n".join(failures[:20])


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    for (name, kind), n in sorted(COUNTS.items()):
        print(f"config mutations: {name:8} {kind:22} {n}")
    for name in CONFIGS:
        print(f"config mutations: {name:8} {'total':22} {sum(n for (c, _), n in COUNTS.items() if c == name)}")


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_are_valid(name):
    validate(copy.deepcopy(CONFIGS[name]), SCHEMA_PATH)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_node_with_a_wrong_type_is_named(name):
    failures = []
    for path, value in walk(CONFIGS[name]):
        for bad in wrong_types(path, value):
            cfg = copy.deepcopy(CONFIGS[name])
            get(cfg, path[:-1])[path[-1]] = bad
            failures.append(check_named(name, "wrong type", cfg, dotted(path)))
    assert_all([f for f in failures if f])
    assert COUNTS[name, "wrong type"] > 300


@pytest.mark.parametrize("name", CONFIGS)
def test_every_list_item_with_a_wrong_type_is_named(name):
    failures = []
    for path, value in walk(CONFIGS[name]):
        if not isinstance(value, list):
            continue
        for bad in ({"x": 1}, None, [[1]]):
            cfg = copy.deepcopy(CONFIGS[name])
            get(cfg, path).append(bad)
            failures.append(check_named(name, "wrong list item", cfg, dotted((*path, len(value)))))
    assert_all([f for f in failures if f])
    assert COUNTS[name, "wrong list item"] >= 15


@pytest.mark.parametrize("name", CONFIGS)
def test_an_unknown_key_at_every_level_is_named(name):
    failures = []
    for path, value in [((), CONFIGS[name]), *walk(CONFIGS[name])]:
        if not isinstance(value, dict):
            continue
        for bogus in ("bogus_key", "Steps"):  # in a map of names (methods, models): an entry of the wrong type
            cfg = copy.deepcopy(CONFIGS[name])
            get(cfg, path)[bogus] = 1
            failures.append(check_named(name, "unknown key", cfg, dotted((*path, bogus))))
    assert_all([f for f in failures if f])
    assert COUNTS[name, "unknown key"] > 40


@pytest.mark.parametrize("name", CONFIGS)
def test_deleting_a_key_fails_exactly_when_it_is_required(name):
    failures, optional = [], 0
    for path, _ in walk(CONFIGS[name]):
        parent = schema_at(path[:-1])
        if parent is None:  # inside a model (oneOf): its required keys are deleted below
            continue
        cfg = copy.deepcopy(CONFIGS[name])
        del get(cfg, path[:-1])[path[-1]]
        if path[-1] in parent.get("required", []):
            failures.append(check_named(name, "required key deleted", cfg, dotted(path)))
            continue
        optional += 1
        found = problems(cfg, SCHEMA)  # optional for the schema, but another key may need it
        emptied = dotted(path[:-1])  # deleting the only entry of a map that must not be empty (one model)
        named = any(
            path[-1] in what or path[-1] in key or (key == emptied and "non-empty" in what) for key, what in found
        )
        if found and not named:
            failures.append(f"deleting optional {dotted(path)} gives unrelated problems: {found}")
    for model_kind in ("models", "memory_models"):
        for model, spec in CONFIGS[name]["grid"].get(model_kind, {}).items():
            kind = "architecture" if "hidden_size" in spec else "hub_model"
            for key in SCHEMA["$defs"][kind]["required"]:
                cfg = copy.deepcopy(CONFIGS[name])
                del cfg["grid"][model_kind][model][key]
                failures.append(check_named(name, "required key deleted", cfg, f"grid.{model_kind}.{model}"))
    assert_all([f for f in failures if f])
    assert COUNTS[name, "required key deleted"] > 35 and optional > 5


def combos(name):
    """(description, mutation, key that must be named) for impossible combinations and values out of range."""
    cfg0 = CONFIGS[name]
    main = cfg0["grid"]["main_model"]
    steps = cfg0["grid"]["train"]["steps"]
    tiny = {"hidden_size": 48, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 96}

    def set_(path, value):
        def apply(cfg):
            get(cfg, path[:-1])[path[-1]] = value

        return apply

    def dlc_without_memory(cfg):
        cfg["grid"]["models"][main].pop("memory")
        cfg["grid"]["methods"]["dlc"] = {"estimator": "grpo", "dlc_mu": 0.5}
        cfg["grid"]["tables"]["table4"].append("dlc")

    def append(path, value):
        def apply(cfg):
            get(cfg, path).append(value)

        return apply

    def memory_also_a_model(cfg):
        name = next(iter(cfg["grid"]["memory_models"]))
        cfg["grid"]["models"][name] = copy.deepcopy(cfg["grid"]["memory_models"][name])

    def tiny_models_with(trainer):
        def apply(cfg):
            cfg["grid"]["trainer"] = trainer
            cfg["grid"]["models"][main] = dict(tiny, memory=cfg["grid"]["models"][main].get("memory", "x"))

        return apply

    first = next(iter(cfg0["grid"]["models"]))
    cases = [
        ("DLC without a memory model", dlc_without_memory, "grid.methods.dlc.dlc_mu"),
        ("alpha < 0", set_(("grid", "methods", "iac", "iac_alpha"), -1.0), "grid.methods.iac.iac_alpha"),
        ("mu < 0", set_(("grid", "methods", "grpo", "dlc_mu"), -0.5), "grid.methods.grpo.dlc_mu"),
        ("interval not dividing", set_(("grid", "train", "eval_every"), steps - 1), "grid.train.eval_every"),
        ("interval beyond steps", set_(("grid", "train", "eval_every"), 2 * steps), "grid.train.eval_every"),
        ("interval as a float", set_(("grid", "train", "eval_every"), 25.0), "grid.train.eval_every"),
        ("steps as a float", set_(("grid", "train", "steps"), float(steps)), "grid.train.steps"),
        ("seed as a float", set_(("grid", "seed"), 0.0), "grid.seed"),
        ("extra seed as a float", set_(("grid", "extra_seeds"), {"grpo": [1.0]}), "grid.extra_seeds.grpo.0"),
        ("k > n", set_(("grid", "eval", "k"), 1000), "grid.eval.k"),
        ("n < k", set_(("grid", "eval", "n"), 1), "grid.eval.k"),
        ("unknown method in a table", append(("grid", "tables", "table5"), "grpo_typo"), "grid.tables.table5"),
        ("a method twice in a table", append(("grid", "tables", "figure6"), "dapo"), "grid.tables.figure6"),
        ("an empty table2_3", set_(("grid", "tables", "table2_3"), []), "grid.tables.table2_3"),
        ("main model not a model", set_(("grid", "main_model"), "qwen3-99b"), "grid.main_model"),
        ("memory not defined", set_(("grid", "models", main, "memory"), "no-such"), f"grid.models.{main}.memory"),
        ("memory is a policy model", set_(("grid", "models", main, "memory"), first), f"grid.models.{main}.memory"),
        ("memory model also a model", memory_also_a_model, "grid.memory_models"),
        ("model name not a folder", set_(("grid", "models", "a/b"), tiny), "grid.models"),
        ("no models", set_(("grid", "models"), {}), "grid.models"),
        ("no methods", set_(("grid", "methods"), {}), "grid.methods"),
        ("filtering all", set_(("grid", "methods", "grpo", "filter_easiest"), 1.0), "grid.methods.grpo.filter_easiest"),
        ("unknown estimator", set_(("grid", "methods", "grpo", "estimator"), "ppo"), "grid.methods.grpo.estimator"),
        ("unknown loss", set_(("grid", "methods", "grpo", "loss_agg"), "sum"), "grid.methods.grpo.loss_agg"),
        ("unknown trainer", set_(("grid", "trainer"), "megatron"), "grid.trainer"),
        ("unknown evaluator", set_(("grid", "evaluator"), "sglang"), "grid.evaluator"),
        ("zero steps", set_(("grid", "train", "steps"), 0), "grid.train.steps"),
        ("group of one", set_(("grid", "train", "group_size"), 1), "grid.train.group_size"),
        ("zero learning rate", set_(("grid", "train", "lr"), 0), "grid.train.lr"),
        ("clip_low of 1", set_(("grid", "train", "clip_low"), 1.0), "grid.train.clip_low"),
        ("bad data policy", set_(("grid", "data", "on_error"), "ignore"), "grid.data.on_error"),
        ("unknown eval split", append(("grid", "data", "eval_splits"), "mmlu"), "grid.data.eval_splits"),
        (
            "an eval split twice",
            append(("grid", "data", "eval_splits"), cfg0["grid"]["data"]["eval_splits"][0]),
            "grid.data.eval_splits",
        ),
        ("top_p above 1", set_(("grid", "eval", "top_p"), 1.5), "grid.eval.top_p"),
        ("negative temperature", set_(("grid", "eval", "temperature"), -0.1), "grid.eval.temperature"),
        ("extra seed of an undefined method", set_(("grid", "extra_seeds"), {"nope": [1]}), "grid.extra_seeds.nope"),
        ("prompt without {problem}", set_(("grid", "prompt_template"), "Solve:"), "grid.prompt_template"),
        ("empty experiment name", set_(("mlflow_experiment",), ""), "mlflow_experiment"),
        ("toy with one seed", set_(("toy", "seeds"), 1), "toy.seeds"),
        ("toy momentum of 1", set_(("toy", "momentum"), 1.0), "toy.momentum"),
        ("toy group sizes repeated", set_(("toy", "group_sizes"), [4, 4]), "toy.group_sizes"),
        ("toy alpha 0", set_(("toy", "iac_alpha"), 0), "toy.iac_alpha"),
        ("openrlhf with tiny models", tiny_models_with("openrlhf"), f"grid.models.{main}"),
    ]
    if name == "embedded":
        cases += [
            (
                "heads not dividing the width",
                set_(("grid", "models", main, "num_heads"), 5),
                f"grid.models.{main}.hidden_size",
            ),
            (
                "kv heads not dividing the heads",
                set_(("grid", "models", main, "num_kv_heads"), 3),
                f"grid.models.{main}.num_heads",
            ),
            ("a split missing its size", lambda c: c["grid"]["data"]["splits"].pop("ood"), "grid.data.splits.ood"),
            (
                "eval split without data",
                set_(("grid", "data", "eval_splits"), ["test", "gsm8k"]),
                "grid.data.eval_splits",
            ),
            ("countdown with openrlhf", set_(("grid", "trainer"), "openrlhf"), "grid.data.source"),
            (
                "local trainer with Hub ids",
                set_(("grid", "models", main), {"hf_id": "Qwen/Qwen3-8B"}),
                f"grid.models.{main}",
            ),
            ("no warm start for tiny models", lambda c: c["grid"].pop("warmstart"), "grid.warmstart"),
            ("countdown without splits", lambda c: c["grid"]["data"].pop("splits"), "grid.data.splits"),
        ]
    else:
        cases += [
            ("local trainer with Hub models", set_(("grid", "trainer"), "local"), "grid.warmstart"),
            ("Hub source without a training set", lambda c: c["grid"]["data"].pop("train"), "grid.data.train"),
            (
                "hub with openrlhf and architecture memory",
                set_(("grid", "memory_models", "qwen3-1.7b"), tiny),
                "grid.memory_models.qwen3-1.7b",
            ),
            (
                "zero GPUs",
                set_(("grid", "models", main, "resources", "actor_gpus_per_node"), 0),
                f"grid.models.{main}.resources.actor_gpus_per_node",
            ),
            ("empty hf_id", set_(("grid", "models", main, "hf_id"), ""), f"grid.models.{main}.hf_id"),
            (
                "the control arm at paper scale",
                set_(("grid", "methods", "grpo", "shuffle_rewards"), True),
                "grid.methods.grpo.shuffle_rewards",
            ),
        ]
    return cases


@pytest.mark.parametrize("name", CONFIGS)
def test_impossible_combinations_are_named(name):
    failures = []
    for what, mutate, key in combos(name):
        cfg = copy.deepcopy(CONFIGS[name])
        mutate(cfg)
        failure = check_named(name, "impossible combination", cfg, key, full=True)
        failures.append(failure and f"{what}: {failure}")
    assert_all([f for f in failures if f])
    assert COUNTS[name, "impossible combination"] >= 40


def test_every_problem_is_reported_at_once():
    cfg = copy.deepcopy(CONFIGS["embedded"])
    cfg["grid"]["trainer"] = "openrlhf"  # countdown goes with the local trainer, and tiny models with it too
    cfg["grid"]["train"]["eval_every"] = 30
    cfg["grid"]["eval"]["k"] = cfg["grid"]["eval"]["n"] + 1
    with pytest.raises(ConfigError) as info:
        validate(cfg, SCHEMA_PATH)
    keys = {key for key, _ in info.value.problems}
    assert {"grid.data.source", "grid.train.eval_every", "grid.eval.k", "grid.models.qwen3-tiny-m"} <= keys
    assert str(info.value).startswith(f"invalid config, {len(info.value.problems)} problems:")
    schema_and_cross = copy.deepcopy(CONFIGS["embedded"])
    schema_and_cross["toy"]["steps"] = "many"
    schema_and_cross["grid"]["train"]["eval_every"] = 30
    with pytest.raises(ConfigError) as info:  # the cross-key checks wait until the types are right
        validate(schema_and_cross, SCHEMA_PATH)
    assert [key for key, _ in info.value.problems] == ["toy.steps"]


# ---- through Snakemake: the wiring in workflow/rules/common.smk ----


@pytest.mark.parametrize(
    "mutation, key, dry",
    [
        ({"grid": {"train": {"eval_every": 7}}}, "grid.train.eval_every", False),  # a real run: nothing starts
        ({"grid": {"methods": {"iac": {"estimator": "grpo", "iac_alpha": -1}}}}, "grid.methods.iac.iac_alpha", True),
        ({"toy": {"sedes": 3}}, "toy.sedes", True),
        ({"grid": {"train": {"eval_every": 25.0}}}, "grid.train.eval_every", True),  # would crash range()
    ],
)
def test_snakemake_fails_before_any_job(workflow_dir: Path, mutation, key, dry):
    bad = write_config(workflow_dir / "bad.yaml", mutation)  # layered on the embedded default, as a user does
    args = ("-n",) if dry else ("--cores", "1")
    proc = snakemake(workflow_dir, *args, "--configfile", "config/config.yaml", str(bad), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid config" in out and key in out, out[-3000:]
    assert f"(rule: {rules_for(key)})" in out
    assert "Building DAG" not in out and "Job stats" not in out
    assert not (workflow_dir / "results").exists()  # nothing ran


def _without(cfg, path):
    del get(cfg, path[:-1])[path[-1]]


@pytest.mark.parametrize(
    "mutate, keys",
    [
        (lambda c: _without(c, ("grid", "train", "eval_every")), ["grid.train.eval_every"]),
        (
            lambda c: (c["grid"]["models"]["qwen3-8b"].pop("memory"), c["grid"]["eval"].update(k=16)),
            ["grid.methods.dapo_iac_dlc.dlc_mu", "grid.eval.k"],
        ),
        (lambda c: c["grid"]["eval"].update(n="eight"), ["grid.eval.n"]),
    ],
)
def test_snakemake_rejects_a_bad_paper_config_on_its_own(workflow_dir: Path, mutate, keys):
    cfg = copy.deepcopy(CONFIGS["paper"])
    mutate(cfg)
    bad = write_config(workflow_dir / "paper_bad.yaml", cfg)
    proc = snakemake(workflow_dir, "-n", "--configfile", str(bad), check=False)  # the named file is the whole config
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "invalid config" in out, out[-3000:]
    assert all(key in out for key in keys), out[-3000:]
    assert "Job stats" not in out
    assert not (workflow_dir / "results").exists()
