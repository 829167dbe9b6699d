"""OpenRLHF 0.11.2 importable on a CPU test venv: its GPU-only imports stubbed where they cannot be imported.

``tests/test_openrlhf.py`` (its trainer classes, IAC in its advantage code) and ``tests/test_openrlhf_parity.py``
(its formulas) import the installed ``openrlhf`` package inside :func:`stubbed`; a stub stands in only for a module
that is missing here (flash_attn's CUDA extension; DeepSpeed, Ray, vLLM and datasets where not installed; OpenRLHF's
Ray actor modules, which import vLLM and DeepSpeed), and ``sys.modules`` is restored afterwards, so a later test
imports the real packages again.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
import types
from unittest import mock


def _stub(name: str) -> types.ModuleType:
    module = mock.MagicMock(name=name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers calls find_spec on some
    module.__path__ = []
    return module


def _missing(name: str) -> bool:
    return importlib.util.find_spec(name) is None


def stubbed_names() -> list[str]:
    """The modules that get a stub in this venv."""
    names = []
    if _missing("flash_attn"):
        names += ["flash_attn", "flash_attn.bert_padding", "flash_attn.utils", "flash_attn.utils.distributed"]
    names += [n for n in ("deepspeed", "ray", "vllm", "datasets") if _missing(n)]
    if _missing("vllm") or _missing("deepspeed"):  # OpenRLHF's Ray actor modules import both
        names += [
            "openrlhf.trainer.ray",
            "openrlhf.trainer.ray.launcher",
            "openrlhf.trainer.ray.vllm_engine",
            "openrlhf.utils.deepspeed",
        ]
    return names


@contextlib.contextmanager
def stubbed():
    """Import ``openrlhf`` modules inside; on exit every ``openrlhf`` module imported inside is dropped and each
    stubbed name gets back what it was (nothing, or the module that was there)."""
    names = stubbed_names()
    before = set(sys.modules)
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update({n: _stub(n) for n in names})
    try:
        yield
    finally:
        for n in set(sys.modules) - before:
            if n.startswith("openrlhf"):
                del sys.modules[n]
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
