"""Trainers behind one protocol. A backend is a subpackage here whose ``BACKEND`` implements :class:`Backend`;
its folder name is its ``grid.trainer`` value (the config schema's enum is read from :func:`names`).

Every backend is a trainer core (:class:`Backend`): the workflow asks it what a run needs before any job (its input
files, its segments, the config keys it refuses, the modules the local job server preloads for it), and its jobs hand
it a run's ``settings.json`` (``calibrl.checkpoints.RunStamp``: the compiled method, the settings, the input files),
the segment's end and the job's resources; ``calibrl.backends.jobs`` holds the jobs the rules call. A backend that
trains on a GPU cluster adds its GPU side (``Backend.gpu``, a :class:`GpuSide`; None where it trains on this
machine's CPUs): its SLURM request and layout (and the layout's schema), what a run costs for the cluster planner
(``train_cost``), what its training nodes must pass beyond the preflight's common checks (``preflight_checks``),
which vLLM engine its training starts (``rollout_engine``), what its vLLM processes need (``vllm_plugin``, through
``calibrl.backends.vllm_plugin``, the vLLM plugin entry point), which evaluated checkpoints it removes
(``release``), and the venv its SLURM jobs run in with the requirements that make it (``venv``, ``requirements``).
What GPU backends share (DLC's vLLM model and memory trainer, Ray on SLURM, the reward's grading) is
``calibrl.gpu``. Adding a backend is a folder with a ``BACKEND`` (docs/architecture.md, "Adding things").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import cache
from typing import Protocol

from calibrl.checkpoints import RunStamp
from calibrl.cost import RunCost, RunPlan
from calibrl.runs import Run
from calibrl.spec import MethodSpec


class CheckFailed(RuntimeError):
    """A preflight check that failed: ``cause`` (what was seen) and ``fix`` (what to do)."""

    def __init__(self, cause: str, fix: str):
        super().__init__(cause)
        self.cause, self.fix = cause, fix


def canary_check(trainer) -> Callable[[dict], str]:
    """A GPU backend's preflight check ``canary``: the shared training canary (``calibrl.gpu.canary.check``) of
    ``trainer`` (a ``calibrl.gpu.canary.Trainer``), its failure a :class:`CheckFailed`."""

    def check(p: dict) -> str:
        from calibrl.gpu import canary

        try:
            return canary.check(p, trainer)
        except canary.Failed as err:
            raise CheckFailed(err.cause, err.fix) from err

    return check


class Backend(Protocol):
    """The trainer core, which every backend implements."""

    name: str
    extends_runs: bool  # a longer run resumes a shorter one's checkpoints (its length is no part of its identity)
    env: str  # the conda environment of its jobs (``--sdm conda``), relative to the workflow's rules
    ignored: dict[str, str]  # dotted keys under grid this backend never reads -> why (set, they are refused)
    preload: tuple[str, ...]  # modules its jobs import, which the local job server imports once (calibrl.jobserver)
    # Its GPU side, where it trains on a GPU cluster; None: it trains on this machine's CPUs (no layout, no SLURM GPU
    # request, no preflight, not priced by the cluster planner, its checkpoints never released).
    gpu: GpuSide | None

    def problems(self, grid: dict, runs: list[tuple[Run, MethodSpec]]) -> list[tuple[str, str]]:
        """(dotted key, what is wrong) for what this backend cannot run; ``grid`` has its defaults filled in."""

    def model_file(self, model: str, data: int) -> str:
        """The file under the results folder that names model ``model``'s folder (the rule making it prepares it)
        for the runs on data seed ``data`` (a model warm-started on that seed's problems; a downloaded model is the
        same for every data seed)."""

    def inputs(self, grid: dict, run: Run, spec: MethodSpec, data: int) -> dict[str, str]:
        """A run's input files under the results folder besides its data: ``init`` (the policy), ``memory``
        (DLC), ``success`` (the filtering baseline's ranking, where a job of its own makes it); ``data``: the run's
        data seed."""

    def segments(self, grid: dict, run: Run, spec: MethodSpec) -> list[int]:
        """The steps at which the run's training jobs end, the last one ``grid.train.steps``."""

    def warmstart(self, params: dict, sft_path: str, model_dir: str, info_path: str, threads: int) -> None:
        """Rule warmstart's job, where ``model_file`` names a model that a warm start makes (``params``:
        ``calibrl.grid.warmstart_params``); a backend whose models are downloads raises."""

    def train(self, settings_path: str, stop_at: int, threads: int, workers: int) -> None:
        """Train the run of ``settings_path`` up to step ``stop_at``, resuming from its last checkpoint; called
        under the run's lock once its folder is claimed for these settings (``calibrl.backends.jobs``)."""

    def metrics(self, run_dir: str, out_path: str) -> None:
        """The run's per-step training metrics as JSON lines (``step`` and the scalars) into ``out_path``."""


class GpuSide(Protocol):
    """What a backend that trains on a GPU cluster adds to its core (``Backend.gpu``)."""

    # The venv its SLURM jobs run in, relative to the repository root: the workflow exports it as CALIBRL_GPU_VENV
    # unless that is set (slurm/config.yaml's precommand puts its bin/ first on PATH), and
    # ``scripts/cluster_env.sh build <name>`` makes it from ``requirements``.
    venv: str
    requirements: str  # its pinned requirements file for that venv, relative to the repository root
    layout: dict  # the JSON schema of grid.models.<name>.resources (its GPU layout): {"layout": ..., "overlay": ...}

    def request(self, grid: dict, run: Run, spec: MethodSpec) -> dict:
        """What one training job asks SLURM for beyond the profile's defaults (``nodes``, ``gres``)."""

    def resources(self, grid: dict, run: Run, spec: MethodSpec) -> dict:
        """How the run is laid out on its hardware: carried by ``settings.json``, no part of its identity."""

    def rollout_engine(
        self, train: dict, spec: MethodSpec, layout: dict, model: str, memory: str | None
    ) -> dict | None:
        """The vLLM engine a run's training starts (``grid.train``, its compiled method and layout, its model's
        folder and DLC's memory's), as the preflight's ``vllm`` check starts it; None where it starts none. An
        ``env`` key, where present, holds variables the engine's processes start with (as the backend's launcher
        gives them: a CPU rehearsal's platform)."""

    def preflight_checks(self) -> dict[str, Callable[[dict], str]]:
        """The checks its training nodes need beyond the preflight's common ones (``calibrl.preflight``), by name:
        each takes the preflight job's params and returns what it saw or raises :class:`CheckFailed`."""

    def vllm_plugin(self, stamp: RunStamp) -> None:
        """Called in every process vLLM starts for a run of this backend (``stamp``: its settings.json), through
        ``calibrl.backends.vllm_plugin``: what those processes need installed."""

    def train_cost(self, plan: RunPlan, a: dict) -> RunCost:
        """What one run costs on its GPUs (``calibrl.cost``'s throughput model, assumptions ``a``), for the cluster
        planner (``calibrl.plan``)."""

    def release(self, policy_dir: str, step: int, keep_steps: list[int]) -> bool:
        """Remove an evaluated checkpoint where the backend's checkpoints are large (``grid.retention``); returns
        whether it was removed."""


@cache
def names() -> list[str]:
    """The backends there are: the subpackages of this package."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def get(name: str) -> Backend:
    """The backend called ``name`` (its folder), imported on first use."""
    if name not in names():
        raise ValueError(f"unknown trainer {name!r}; the backends are {names()}")
    return importlib.import_module(f"{__name__}.{name}").BACKEND
