"""Where a result was computed: the machine and torch build behind it, and the hash of the weights it started from.

A CPU run reproduces bit for bit on the same CPU instruction set and torch build; elsewhere torch's kernels round
floats differently and only the statistics reproduce (docs/reruns.md). What is recorded here says which case a
rerun is in.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import sys
from pathlib import Path

# CPU flags that change which kernels torch runs, and so the float rounding of their results (vector width, fused
# multiply-add, reduced-precision dot products)
ISA = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16",
       "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile", "asimd", "sve", "sve2")  # fmt: skip
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    out: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


@functools.cache
def machine() -> dict:
    """The CPU, its float-relevant instruction sets and the torch build that computed a result.

    Recorded beside a warm start and a recording, so that a rerun can tell whether it should match bit for bit (the
    same ISA and build) or only within the recorded spread."""
    import torch

    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())  # x86 / ARM spelling
    return {
        "cpu": info.get("model name") or platform.processor() or "unknown",
        "isa": sorted(flags & set(ISA)),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": bool(torch.backends.mkl.is_available()),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "python": platform.python_version(),
        "platform": platform.machine() or sys.platform,
    }


def weights_sha256(model_dir: str | Path) -> str:
    """SHA-256 over a model folder's weight files (each relative path and size, then its bytes, in path order).

    Only the weights: two warm starts with equal weights hash the same whatever their config or tokenizer files
    say, and one flipped byte of a weight changes it."""
    root = Path(model_dir)
    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and p.name.endswith(WEIGHTS) and not p.name.startswith(".")),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    if not files:
        raise FileNotFoundError(f"{root}: no weight files ({', '.join(WEIGHTS)})")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_size}\0".encode())  # where one file ends
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
