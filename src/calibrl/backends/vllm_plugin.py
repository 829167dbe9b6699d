"""The package's ``vllm.general_plugins`` entry point for the backends (pyproject.toml): vLLM calls :func:`plugin` in
every process it starts. In a run's processes (their inherited ``CALIBRL_SETTINGS`` names the run's settings.json,
as a backend's launcher sets it) it hands them to the GPU side of the run's backend (``GpuSide.vllm_plugin``);
elsewhere, as in the evaluator's engines or a CPU backend's runs, it does nothing. DLC's composite model registers
through an entry point of its own (``calibrl.gpu.vllm_dlc``)."""

from __future__ import annotations

from calibrl import backends
from calibrl.checkpoints import RunStamp


def plugin() -> None:
    stamp = RunStamp.from_env()  # checkpoints.SETTINGS_ENV
    gpu = backends.get(stamp.backend).gpu if stamp is not None else None
    if gpu is not None:  # a CPU backend's runs start no vLLM engine
        gpu.vllm_plugin(stamp)
