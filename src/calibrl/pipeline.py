"""The jobs the workflow's rules call, one function each, and where each lives.

Each job takes its rule's params (its slice of the config, built by ``calibrl.grid.*_params``) and paths, so
a rule's script is one call and the same job runs by hand or from a test. A job's module is imported when
the job is first used, so a data job does not pay for torch and transformers (PEP 562).
"""

from __future__ import annotations

import importlib

JOBS = {
    "data_job": "calibrl.data.jobs",  # rule data_synthetic
    "download_job": "calibrl.data.jobs",  # rule data_download
    "download_model_job": "calibrl.model_store",  # rule download_model
    "warmstart_job": "calibrl.train.jobs",  # rule warmstart
    "settings_job": "calibrl.checkpoints",  # rule run_settings
    "train_job": "calibrl.train.jobs",  # rule train
    "metrics_job": "calibrl.train.openrlhf.job",  # rule train_metrics (paper scale)
    "rank_job": "calibrl.evaluate_vllm",  # rule rank_train
    "evaluate_job": "calibrl.evaluate",  # rule evaluate
}
__all__ = list(JOBS)


def __getattr__(name: str):
    if name not in JOBS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(JOBS[name]), name)


def __dir__() -> list[str]:
    return __all__
