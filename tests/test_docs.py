"""The docs say what the code has: config/README.md is what scripts/config_readme.py writes from the config schema,
and every module, file, test, link and `make` target the docs name exists (read from the source, nothing imported).
The commands of the docs' bash blocks are tests/test_readme.py's."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import REPO

SRC = REPO / "src" / "calibrl"
# The docs these tests read (CHANGELOG.md is history: it may name what no longer exists).
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "config" / "README.md",
    REPO / "benchmarks" / "README.md",
]
# The user-facing guides: no issue numbers, no plan revisions (those are CHANGELOG.md's and benchmarks/README.md's).
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "config" / "README.md"]

MODULE = re.compile(r"(?<![\w/.-])calibrl(?:\.[A-Za-z_]\w*)+")
ROOTS = r"src/calibrl|calibrl|scripts|tests|benchmarks|workflow|config|docs|slurm|envs|profiles|\.test|\.ci"
PACKAGE_ROOTS = r"algo|backends|data|evaluate|gpu|grading|preflight|report|toy"  # written relative to src/calibrl
PATH = re.compile(rf"(?<![\w./<>-])((?:{ROOTS}|{PACKAGE_ROOTS})/[\w./<>{{}}*-]*[\w/>}}*])(?:::(\w+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAKE = re.compile(r"^[ \t]*make[ \t]+([^\s`=]+)", re.M)  # in code: spans and blocks, one a line
KNOWN_DRIFT: set[str] = set()  # names the docs give that do not resolve, each reported to its owner


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ------------------------------------------------------------------------------------------- config/README.md
def test_config_readme_is_generated_from_the_schema():
    """In a process of its own: a test that registers a formula (tests/test_backends.py) would change the enums."""
    proc = subprocess.run(
        [sys.executable, "scripts/config_readme.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (
        f"config/README.md is not what workflow/schemas/config.schema.yaml (with the registries' names and the "
        f"backends' layouts) gives: run `make docs` (or .venv/bin/python scripts/config_readme.py)\n{proc.stderr}"
    )


def test_config_readme_lists_every_key_of_the_embedded_default():
    """Every key config/config.yaml sets, nested, has a row (a map's own keys stand as <name>)."""
    import yaml

    from calibrl import config

    text = _text(REPO / "config" / "README.md")
    cfg = yaml.safe_load(_text(REPO / "config" / "config.yaml"))
    root = config.schema()

    def keys(value, node, prefix):
        node = config._resolve(node, root)
        yield prefix
        if not isinstance(value, dict):
            return
        props, extra = node.get("properties", {}), node.get("additionalProperties")
        for key, child in value.items():
            if key in props:
                yield from keys(child, props[key], f"{prefix}.{key}" if prefix else key)
            elif isinstance(extra, dict) and "properties" in config._resolve(extra, root):
                yield from keys(child, extra, f"{prefix}.<name>")

    listed = [k for k in keys(cfg, root, "") if "." in k and not k.endswith(".<name>")]  # top level: a heading
    assert len(listed) > 50, listed
    missing = [k for k in dict.fromkeys(listed) if f"`{k}`" not in text]
    assert not missing, f"config/README.md has no row for {missing}"


# ------------------------------------------------------------------------------------------- names in the docs
@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(_text(path))


def _names(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body binds: definitions, assignments, imports (inside if/try blocks too)."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                out |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try):
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            out |= _names([*node.body, *node.orelse, *handlers, *getattr(node, "finalbody", [])])
    return out


def _module_file(parts: list[str]) -> Path | None:
    path = REPO / "src" / Path(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def resolves(dotted: str) -> bool:
    """Whether ``calibrl.a.b.C.d`` names a module of the package, then a name its source binds (and, for a class, a
    name its body binds)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if (module := _module_file(parts[:i])) is not None:
            break
    else:
        return False
    rest = parts[i:]
    if not rest:
        return True
    tree = _tree(module)
    if rest[0] not in _names(tree.body):
        return (module.parent / f"{rest[0]}.py").is_file() if module.name == "__init__.py" else False
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if len(rest) > 1 and rest[0] in classes:
        return rest[1] in _names(classes[rest[0]].body)
    return True


def _code(text: str) -> str:
    """What the docs write as code: inline spans and fenced blocks (prose may say "calibrl" freely)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    spans = re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return "\n".join([*blocks, *spans])


def _mentions(pattern: re.Pattern, code_only: bool = False) -> list[tuple[str, re.Match]]:
    out = []
    for doc in DOCS:
        text = _text(doc)
        out += [(_rel(doc), m) for m in pattern.finditer(_code(text) if code_only else text)]
    return out


def test_every_module_the_docs_name_exists():
    found = _mentions(MODULE)
    assert len(found) > 50, len(found)  # the scan sees them
    bad = sorted({(doc, m[0]) for doc, m in found if m[0] not in KNOWN_DRIFT and not resolves(m[0])})
    assert not bad, f"names no module or attribute of src/calibrl: {bad}"


def test_the_known_drift_is_still_there():
    """An entry of KNOWN_DRIFT is a name the docs still give that does not resolve: once fixed, remove it."""
    named = {m[0] for _, m in _mentions(MODULE)}
    assert KNOWN_DRIFT <= named, f"no doc names {sorted(KNOWN_DRIFT - named)} any more: remove it from KNOWN_DRIFT"
    assert not any(resolves(name) for name in KNOWN_DRIFT), "a KNOWN_DRIFT entry resolves now: remove it"


def _path(token: str) -> Path:
    root = token.split("/")[0]
    if re.fullmatch(PACKAGE_ROOTS, root):
        return SRC / token
    return REPO / "src" / token if root == "calibrl" else REPO / token


def test_every_file_the_docs_name_exists():
    """`scripts/...`, `tests/...::test_name`, `src/calibrl/...` (or relative to it), `config/...` and the rest;
    a pattern (`*`, `{model}`, `<name>`) is left alone."""
    found = _mentions(PATH)
    assert len(found) > 50, len(found)
    bad = []
    for doc, m in found:
        token, test = m[1], m[2]
        if re.search(r"[<>{}*]", token):
            continue
        path = _path(token)
        if not path.exists():
            bad.append((doc, token))
        elif test and test not in _names(_tree(path).body):
            bad.append((doc, f"{token}::{test}"))
    assert not bad, f"no such file (or test): {sorted(set(bad))}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_and_anchor_resolves():
    """Markdown links to files of the repository (results/, which git ignores, excepted) and their #anchors."""
    bad = []
    for doc in [*DOCS, REPO / "CHANGELOG.md"]:
        for target in LINK.findall(_text(doc)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if _rel(path).startswith("results/"):
                continue
            if not path.exists():
                bad.append((_rel(doc), target))
            elif anchor:
                headings = re.findall(r"^#+ (.*)$", _text(path), re.M)
                if anchor not in {_slug(h) for h in headings}:
                    bad.append((_rel(doc), target))
    assert not bad, f"broken links: {bad}"


@cache
def make_targets() -> set[str]:
    """The Makefile's targets, its variables expanded, as make's own database lists them (not files it merely finds
    on disk)."""
    out = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile", ":"], cwd=REPO, capture_output=True, text=True, timeout=60
    ).stdout
    files = out[out.index("# Files") : out.index("# Finished Make data base")]
    targets = set()
    for entry in files.split("\n\n"):
        if "# Not a target:" in entry:
            continue
        for line in entry.splitlines():
            if (m := re.match(r"^([^#\s=:][^=:]*):(?![:=])", line)) and not m[1].startswith("."):
                targets.add(m[1])
            elif m := re.match(r"^(\.[\w-]+/\.installed):", line):  # the venvs: make .venv-vllm/.installed
                targets.add(m[1])
    return targets


def test_every_make_target_the_docs_name_is_the_makefiles():
    found = _mentions(MAKE, code_only=True)
    targets = {m[1] for _, m in found}
    assert {"run", "test", "test-fast", "rehearsal"} <= targets, targets  # the scan sees them
    assert {"run", "test", "docs", ".venv-vllm/.installed"} <= make_targets(), make_targets()
    bad = sorted({(doc, m[1]) for doc, m in found if m[1] not in make_targets()})
    assert not bad, f"no such make target: {bad}"


@pytest.mark.parametrize("doc", GUIDES, ids=_rel)
def test_the_guides_carry_no_issue_numbers_or_revision_history(doc):
    """History lives in CHANGELOG.md (and timings' history in benchmarks/README.md), not in the guides."""
    text = _text(doc)
    assert not re.findall(r"(?i)\bissues? \d+", text), f"{_rel(doc)}: an issue number"
    assert not re.findall(r"(?i)\b(?:first|second|third|fourth|fifth) revision\b", text), f"{_rel(doc)}: history"
