"""How the OpenRLHF backend patches OpenRLHF 0.11.2: named targets, checked before anything runs, applied on import.

Every patch names the symbols it wraps as :class:`Target` ("module:Class.attribute"). :meth:`Target.check` finds a
target in the installed OpenRLHF's source without importing it (the launcher checks every target of a run's
patches before Ray starts: a different OpenRLHF fails there, naming the symbol); :meth:`Target.wrap` replaces it
once, marked, when its module is imported.

Lazy, because Ray runs the setup hook in every worker process (vLLM engines and DeepSpeed actors too) before any
actor code, and importing OpenRLHF's trainer there would import DeepSpeed and vLLM, and with them CUDA, before
Ray has set the worker's visible devices: :func:`when_imported` registers an import hook, and a patch is applied
when (and in the process where) its module is imported. This module imports only the standard library.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PINNED = "0.11.2"
MARK = "__calibrl_patch__"


class PatchTargetMissing(RuntimeError):
    """An installed package (OpenRLHF, or vLLM, DeepSpeed, torch) lacks a symbol a patch wraps, or has it in another
    shape than the pinned release's."""


@dataclass(frozen=True)
class Target:
    """``module`` and the dotted ``name`` inside it (``Class.method`` or a module-level name); ``uses``: text its
    source must contain (a call the patch relies on, e.g. ``vllm.AsyncEngineArgs(``); ``params``: its parameter
    names in order, where the wrapper relies on them (``*args``, ``**kwargs`` written so)."""

    module: str
    name: str
    uses: str | None = None
    params: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"

    def _missing(self, why: str) -> PatchTargetMissing:
        package = self.module.split(".")[0]
        pins = f"OpenRLHF {PINNED} (pip install openrlhf=={PINNED})"
        if package != "openrlhf":  # vLLM, DeepSpeed, torch: the versions the cluster environment pins with it
            pins += f" and the {package} that envs/cluster-train.yaml pins; the installed {package} is "
            pins += _installed_version(package)
        return PatchTargetMissing(f"{self} {why}: calibrl patches {pins}; the installed OpenRLHF is "
                                  f"{_installed_version()}")  # fmt: skip

    def check(self) -> None:
        """Find the target in the installed package's source (nothing is imported, not even the module's parents,
        which would import vLLM and DeepSpeed); raise if it is not there."""
        origin = _source_file(self.module)
        if origin is None:
            raise self._missing("cannot be found (module missing)")
        tree = ast.parse(origin.read_text(encoding="utf-8"))
        scope: list[ast.stmt] = tree.body
        found: ast.stmt | None = None
        for part in self.name.split("."):
            found = next((n for n in scope if _defines(n, part)), None)
            if found is None:
                raise self._missing(f"is not defined in {origin}")
            scope = getattr(found, "body", [])
        if self.uses and self.uses not in ast.unparse(found):
            raise self._missing(f"no longer calls {self.uses!r} ({origin})")
        if self.params is not None:
            got = _params(found)
            if got != self.params:
                raise self._missing(f"takes {got}, not the {self.params} its wrapper relies on ({origin})")

    def resolve(self, module: ModuleType) -> tuple[object, str, object]:
        """(owner, attribute, current value) of the target in the imported ``module``."""
        owner: object = module
        *path, attr = self.name.split(".")
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                raise self._missing("is gone")
        value = getattr(owner, attr, None)
        if value is None:
            raise self._missing("is gone")
        return owner, attr, value

    def wrap(self, module: ModuleType, tag: str, make: Callable[[Callable], Callable]) -> bool:
        """Replace the target by ``make(original)`` (``functools.wraps``-ed), unless patch ``tag`` has wrapped it
        already (several patches may wrap one target, each once). Returns whether it was wrapped now."""
        owner, attr, original = self.resolve(module)
        tags = getattr(original, MARK, frozenset())
        if tag in tags:
            return False
        wrapped = functools.wraps(original)(make(original))
        setattr(wrapped, MARK, tags | {tag})
        setattr(owner, attr, wrapped)
        return True


def _source_file(module: str) -> Path | None:
    """The source file of ``module`` (a.b.c: a's folder / b / c.py or c/__init__.py), found without importing."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return Path(spec.origin) if spec and spec.origin and not parts else None
    for folder in spec.submodule_search_locations:
        base = Path(folder).joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _defines(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.ImportFrom | ast.Import):
        return any((a.asname or a.name.split(".")[-1]) == name for a in node.names)
    return False


def _params(node: ast.stmt) -> tuple[str, ...] | None:
    """A function's parameter names in order (``*args``, ``**kwargs`` so written); None for anything else."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    a = node.args
    star = [f"*{a.vararg.arg}"] if a.vararg else []
    return tuple([p.arg for p in [*a.posonlyargs, *a.args]] + star + [p.arg for p in a.kwonlyargs]
                 + ([f"**{a.kwarg.arg}"] if a.kwarg else []))  # fmt: skip


def _installed_version(package: str = "openrlhf") -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------------------------------ import hook
class _PatchAfterExec(importlib.abc.Loader):
    """Runs the module with its own loader, puts that loader back, then calls the callbacks on it."""

    def __init__(self, loader, callbacks: list[Callable[[ModuleType], None]]):
        self._loader, self._callbacks = loader, callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for callback in list(self._callbacks):
            callback(module)

    def __getattr__(self, name: str):  # get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of the watched modules that the other finders find."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        callbacks = self.callbacks.get(fullname)
        if not callbacks:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            raise ImportError(f"calibrl cannot patch {fullname}: its loader {spec.loader!r} has no exec_module")
        spec.loader = _PatchAfterExec(spec.loader, callbacks)
        return spec


_lock = threading.Lock()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import.
    Registering an equal callback twice has no effect."""
    with _lock:
        hook = next((f for f in sys.meta_path if isinstance(f, _ImportHook)), None)
        if hook is None:
            hook = _ImportHook()
            sys.meta_path.insert(0, hook)
        callbacks = hook.callbacks.setdefault(name, [])
        if callback in callbacks:
            return
        callbacks.append(callback)
        module = sys.modules.get(name)
    if module is not None:
        callback(module)


def remove_hooks() -> None:
    """Take the import hook out of ``sys.meta_path`` (tests that install patches clean up with this)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ImportHook)]
