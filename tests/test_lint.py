"""The standing checks: ruff and snakemake --lint are clean, the package's imports follow its contracts, and so do
the imports it makes by name (entry points, job targets, the job server's and the setup hook's modules)."""

import ast
import importlib.util
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import REPO

import calibrl
from calibrl import backends, evaluate, jobserver

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
TARGET = re.compile(r"^(calibrl(?:\.\w+)+)(?::(\w+))?$")  # "module" or "module:function"


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_layers_point_one_way():
    """import-linter's contracts (pyproject.toml, tool.importlinter): no import cycle among calibrl's modules, each
    importing only from the layers below it; the two backends independent of each other."""
    lint = Path(sys.executable).parent / "lint-imports"  # import-linter's command, beside this interpreter
    proc = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and "4 kept, 0 broken" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_forbidden_contract_covers_every_module_outside_the_backends():
    """A module the contract does not list could import a backend unseen: every top-level module of calibrl (and
    calibrl.backends' own modules) is a source of "only a backend's folder imports it"."""
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"] == "only a backend's folder imports it"]
    top = {f"calibrl.{m.name}" for m in pkgutil.iter_modules(calibrl.__path__)} - {"calibrl.backends"}
    inside = {f"calibrl.backends.{m.name}" for m in pkgutil.iter_modules(backends.__path__) if not m.ispkg}
    assert set(contract["source_modules"]) == top | inside
    # every subpackage of calibrl.backends (import-linter's wildcard: one level), a new backend's folder too
    assert contract["forbidden_modules"] == ["calibrl.backends.*"] and backends.names()


def _named_targets() -> list[tuple[str, str]]:
    """(where, target) of every import made by name: "module:function" and module strings in the scripts, rules
    and package, the entry points, and the modules the job server and the setup hook import."""
    out = []
    files = [*sorted((REPO / "scripts").glob("*.py")), *sorted((REPO / "src" / "calibrl").rglob("*.py"))]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value):
                out.append((str(path.relative_to(REPO)), node.value))
    for path in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        strings = re.finditer(r"[\"'](calibrl[\w.:]+)[\"']", path.read_text())
        out += [(str(path.relative_to(REPO)), m[1]) for m in strings]
    groups = [PYPROJECT["project"]["scripts"], *PYPROJECT["project"]["entry-points"].values()]
    out += [("pyproject.toml", value) for group in groups for value in group.values()]
    for name in backends.names():
        out += [(f"src/calibrl/backends/{name}/", m) for m in backends.get(name).preload]
    out += [("src/calibrl/evaluate/", m) for name in evaluate.names() for m in evaluate.preload(name)]
    out += [("src/calibrl/jobserver.py", m) for m in jobserver.PRELOAD if m.startswith("calibrl")]
    return out


def test_every_import_by_name_resolves_and_keeps_the_backends_apart():
    """Each "module:function" and each module a list names exists and defines the named function (read from its
    source, nothing imported; other strings of that shape, logger names, are left alone); a name inside a backend's
    folder is only ever written in that folder."""
    found, stray = _named_targets(), []
    assert len(found) > 20 and any(t.endswith(":warmstart_job") for _, t in found)  # the scan sees them
    for where, target in found:
        module, _, function = target.partition(":")
        listed = where.endswith("/") or where == "src/calibrl/jobserver.py"  # a module list: every entry a module
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:  # its parent is no package: a logger's name
            spec = None
        if function or listed:
            assert spec is not None and spec.origin, f"{where}: {target!r} names no module"
        if function:
            tree = ast.parse(Path(spec.origin).read_text())
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
            defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if hasattr(t, "id")}
            assert function in defined, f"{where}: {target!r}: {spec.origin} defines no {function}"
        for name in backends.names():
            own = f"src/calibrl/backends/{name}/"
            if target.startswith(f"calibrl.backends.{name}.") and not where.startswith(own):
                stray.append((where, target))
    assert not stray, sorted(stray)


def test_the_vllm_plugins_the_code_checks_for_are_pyprojects():
    """calibrl.plugins.check compares the installed entry points with VLLM_PLUGINS: they must be pyproject's."""
    from calibrl import plugins

    assert PYPROJECT["project"]["entry-points"]["vllm.general_plugins"] == plugins.VLLM_PLUGINS
