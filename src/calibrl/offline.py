"""The environment of every job on a compute node: offline, no telemetry, no compiler where a prebuilt path exists.

Compute nodes often have no internet and no CUDA toolkit. ``ENV`` is set by every GPU job (training, evaluation,
ranking, the preflight) and passed to the Ray actors (``calibrl.backends.openrlhf.launch.runtime_env``), so a check
that passes in the preflight passes in the jobs:

* ``HF_HUB_OFFLINE``: models are the login node's downloads (``calibrl.model_store``), read by path;
* ``VLLM_USE_FLASHINFER_SAMPLER=0``: vLLM 0.29's top-k/top-p sampler would use FlashInfer on CUDA, whose kernels
  ``flashinfer-python`` 0.6.18 compiles with ``nvcc`` on first use (vllm/envs.py, v1/sample/ops/topk_topp_sampler.py;
  start-up profiling of the V1 runner samples with top-p 0.9); PyTorch's sampler needs no compiler;
* no usage statistics from vLLM, Ray or Hugging Face (calls out that hang or fail offline).

Compile caches go to the node's own disk (:func:`cache_env`): vLLM's (``VLLM_CACHE_ROOT``: torch.compile artifacts),
Triton's kernels (``TRITON_CACHE_DIR``), inductor's (``TORCHINDUCTOR_CACHE_DIR``) and the rest of ``~/.cache``
(``XDG_CACHE_HOME``: torch extensions, FlashInfer) default to the home folder, on the cluster's shared file system:
slow, and written at once by every engine of every node. They go under ``$TMPDIR`` (a site's per-job scratch)
or ``/tmp/calibrl-cache-<user>`` (the user's jobs on a node share it, as one job's engines on a node do), each only
where the user has not set it; ``HF_HOME`` stays where Hugging Face looked before (``~/.cache/huggingface``):
the models are read by path, but a token or a cache kept there stays found.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}


# The compile caches moved to the node (cache_env): variable -> its folder under the node-local base.
CACHES = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "XDG_CACHE_HOME": "xdg",
}


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # no passwd entry for the uid (some containers)
        return str(os.getuid())


def cache_base(environ: Mapping[str, str]) -> Path:
    """The node-local folder of this job's compile caches: ``$TMPDIR/calibrl-cache`` where the site sets a scratch
    folder (SLURM's per-job one, removed with the job), else ``/tmp/calibrl-cache-<user>``."""
    if environ.get("TMPDIR"):
        return Path(environ["TMPDIR"]) / "calibrl-cache"
    return Path("/tmp") / f"calibrl-cache-{environ.get('USER') or _user()}"


def cache_env(environ: Mapping[str, str], home: Path | None = None) -> dict[str, str]:
    """The cache variables a job gets (:data:`CACHES`): each one ``environ`` lacks, under :func:`cache_base`; and,
    where ``XDG_CACHE_HOME`` is set here, ``HF_HOME`` (unless set) pinned to where Hugging Face looked without it
    (``<home>/.cache/huggingface``)."""
    base = cache_base(environ)
    out = {name: str(base / sub) for name, sub in CACHES.items() if not environ.get(name)}
    if "XDG_CACHE_HOME" in out and not environ.get("HF_HOME"):
        out["HF_HOME"] = str((home or Path.home()) / ".cache" / "huggingface")
    return out


def apply() -> None:
    """Set ``ENV`` and the node-local caches (:func:`cache_env`) in this process (inherited by what it starts: Ray's
    nodes and actors); a value the user exported wins."""
    for name, value in {**ENV, **cache_env(os.environ)}.items():
        os.environ.setdefault(name, value)
