"""Defaults live in one place, the config schema: ``calibrl.config.validate`` fills them in before any reader runs, so
a reader takes a key as it is. A literal fallback in a read (``x.get("key", 0.01)``) is a second copy that drifts
from the schema's, or a hidden default the schema does not show; this test finds them in the package and the rules.

A key the schema gives a default is read without a fallback. A key it gives none is optional (its absence means
"none"): a read may fall back to None or an empty container, never to a value."""

from __future__ import annotations

import ast
import re

import yaml
from conftest import REPO

from calibrl import backends

# (file, key) -> why the read is not of the config, though the key shares a name with a config key
NOT_CONFIG = {
    ("src/calibrl/analysis_plan.py", "seeds"): "config/plan.yaml's, which has no schema (the plan module's defaults)",
    ("src/calibrl/backends/openrlhf/cpu_standins.py", "resources"): "settings.json: None for CPU backends' runs",
    ("src/calibrl/report/mlflow_view.py", "iac_alpha"): "an MLflow tag, empty for the base model (it has no method)",
    ("src/calibrl/report/mlflow_view.py", "dlc_mu"): "an MLflow tag, empty for the base model (it has no method)",
    ("src/calibrl/tasks.py", "source"): "a data record's source field, not grid.data.source",
    ("workflow/rules/train.smk", "nodes"): "a backend's SLURM request: a CPU backend's asks for nothing (one node)",
}


def schema_keys() -> tuple[set[str], set[str]]:
    """Every property name of the config schema (with what each GPU backend contributes: ``GpuSide.layout``), and
    those given a default somewhere in it."""
    names, defaulted = set(), set()

    def walk(node):
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                names.add(key)
                if isinstance(sub, dict) and "default" in sub:
                    defaulted.add(key)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text()))
    walk([gpu.layout for name in backends.names() if (gpu := backends.get(name).gpu) is not None])
    assert {"vllm_engines", "zero_stage"} <= names  # OpenRLHF's layout, from its folder
    return names, defaulted


def _literal(node: ast.AST):
    """The fallback's value if it is a literal (``ast.literal_eval``), else a marker that it is not one."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _literal


def fallbacks(source: str) -> list[tuple[int, str, object]]:
    """(line, key, fallback) of each ``x.get("key", lit)``, ``x.setdefault("key", lit)``, ``x.get("key") or lit``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        call, value = None, _literal
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and len(node.args) == 2:
            if node.func.attr in ("get", "setdefault"):
                call, value = node, _literal(node.args[1])
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
            first = node.values[0]
            if isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "get":
                if len(first.args) == 1:
                    call, value = first, _literal(node.values[1])
        if call is None or value is _literal:
            continue
        key = call.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            out.append((node.lineno, key.value, value))
    return out


def offenders(files: dict[str, str]) -> list[str]:
    names, defaulted = schema_keys()
    out = []
    for path, source in files.items():
        for line, key, value in fallbacks(source):
            if key not in names or (path, key) in NOT_CONFIG:
                continue
            if key in defaulted:
                out.append(f"{path}:{line}: {key!r} falls back to {value!r}; the schema's default is filled in")
            elif value not in (None, {}, [], (), ""):
                out.append(f"{path}:{line}: {key!r} falls back to {value!r}, a default the schema does not show")
    return out


def rule_python(text: str) -> str:
    """The Python a .smk file's lines hold, a line at a time (the file as a whole is not Python): each line as it
    is, or without a rule directive's ``name=`` and trailing comma; lines that parse neither way are dropped."""
    out = []
    for line in text.splitlines():
        stripped = line.split("  #")[0].strip()
        for expr in (stripped, re.sub(r"^\w+\s*=\s*", "", stripped).rstrip(",")):
            try:
                ast.parse(expr)
            except SyntaxError:
                continue
            out.append(expr)
            break
        else:
            out.append("")
    return "\n".join(out)


def _sources() -> dict[str, str]:
    files = {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "src" / "calibrl").rglob("*.py"))}
    for p in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        files[str(p.relative_to(REPO))] = rule_python(p.read_text())
    return files


def test_no_read_carries_a_default_of_its_own():
    found = offenders(_sources())
    assert not found, "defaults belong in workflow/schemas/config.schema.yaml:\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_fallback():
    # the test above can fail: each form it looks for, on a key with a schema default and on one without
    source = (
        'a = grid["claims"].get("last_checkpoints", 2)\n'
        'b = train.setdefault("weight_decay", 0.01)\n'
        'c = spec.get("revision") or "main"\n'
        'd = layout.get("vllm_engines", 1)\n'
        'e = data.get("splits", {})\n'  # optional, no default: absent means none
        'f = record.get("no_such_config_key", 3)\n'
    )
    found = offenders({"x.py": source})
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4"], found
    assert offenders({"src/calibrl/tasks.py": 'record.get("source", "x")'}) == []


def test_rules_are_scanned_too():
    smk = 'rule r:\n    params:\n        last=GRID["claims"].get("last_checkpoints", 2),  # a note\n    threads: 1\n'
    assert rule_python(smk).splitlines()[1:3] == ["", 'last=GRID["claims"].get("last_checkpoints", 2),']
    assert offenders({"r.smk": rule_python(smk)})
