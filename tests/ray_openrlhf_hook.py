"""Test-only: a Ray ``worker_process_setup_hook`` that stubs OpenRLHF's GPU-only imports, then runs the real hook.

On CPU, ``.venv-vllm`` has real Ray, OpenRLHF 0.11.2 and vLLM, but not DeepSpeed, flash-attn or datasets, which
OpenRLHF's trainer modules import at load time. ``setup`` puts stand-ins for exactly those (and for OpenRLHF's
modules that import them) into ``sys.modules`` and then calls the hook named in ``CALIBRL_TEST_REAL_HOOK``,
the launcher's own (``calibrl.backends.openrlhf.hook.setup``), so the patches a worker gets are the real ones.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from unittest import mock

MISSING_ON_CPU = ["deepspeed", "flash_attn", "datasets"]
FLASH = ["flash_attn.bert_padding", "flash_attn.utils", "flash_attn.utils.distributed"]
NEEDS_DEEPSPEED = [
    "openrlhf.trainer.ray",
    "openrlhf.trainer.ray.launcher",
    "openrlhf.trainer.ray.vllm_engine",
    "openrlhf.utils.deepspeed",
]


def _stub(name: str):
    module = mock.MagicMock(name=name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__path__ = []
    return module


def stub_gpu_only() -> list[str]:
    """Stand-ins for the GPU-only modules this interpreter lacks; returns the names stubbed."""
    names = [n for n in MISSING_ON_CPU if n not in sys.modules and importlib.util.find_spec(n) is None]
    if "flash_attn" in names:
        names += FLASH
    if "deepspeed" in names:
        names += NEEDS_DEEPSPEED
    for name in names:
        sys.modules[name] = _stub(name)
    return names


def setup() -> None:
    stub_gpu_only()
    module, _, func = os.environ["CALIBRL_TEST_REAL_HOOK"].rpartition(".")
    getattr(importlib.import_module(module), func)()
