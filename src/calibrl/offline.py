"""The environment of every job on a compute node: offline, no telemetry, no compiler where a prebuilt path exists.

Compute nodes often have no internet and no CUDA toolkit. ``ENV`` is set by every GPU job (training, evaluation,
ranking, the preflight) and passed to the Ray actors (``calibrl.backends.openrlhf.launch.runtime_env``), so a check
that passes in the preflight passes in the jobs:

* ``HF_HUB_OFFLINE``: models are the login node's downloads (``calibrl.model_store``), read by path;
* ``VLLM_USE_FLASHINFER_SAMPLER=0``: vLLM 0.29's top-k/top-p sampler would use FlashInfer on CUDA, whose kernels
  ``flashinfer-python`` 0.6.18 compiles with ``nvcc`` on first use (vllm/envs.py, v1/sample/ops/topk_topp_sampler.py;
  start-up profiling of the V1 runner samples with top-p 0.9); PyTorch's sampler needs no compiler;
* no usage statistics from vLLM, Ray or Hugging Face (calls out that hang or fail offline).
"""

from __future__ import annotations

import os

ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}


def apply() -> None:
    """Set ``ENV`` in this process (inherited by what it starts); a value the user exported wins."""
    for name, value in ENV.items():
        os.environ.setdefault(name, value)
