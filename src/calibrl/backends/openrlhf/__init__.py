"""The OpenRLHF backend: paper-scale training with OpenRLHF 0.11.2 (Ray, DeepSpeed, vLLM) on a GPU cluster.

A training job (``OpenRLHFBackend.train``) prepares the run's prompt file (``data``) and runs
``python -m calibrl.backends.openrlhf.launch SETTINGS STOP_AT`` inside a private Ray cluster spanning the job's
SLURM allocation (``src/calibrl/gpu/ray_cluster.sh``). The launcher builds OpenRLHF's command line from the run's
settings.json (``command``), starts Ray with one setup hook (``hook``) that installs the patches every run needs
(``steps``: the step limit; ``fused_adam``: DeepSpeed's optimizer kernel from torch), the one its weight-decay scope
needs (``decay_scope``) and those the run's method names (``iac``; ``loss_norm``: Dr. GRPO's normaliser; ``dlc``),
each naming the pinned symbols it wraps, with their parameters (``calibrl.gpu.patching``), runs
``openrlhf.cli.train_ppo_ray`` and writes a marker per saved checkpoint.
``gpu`` is its GPU side (``OpenRLHFBackend.gpu``: its jobs' venv, a run's layout and SLURM request, its rollout
engine, preflight checks, price and checkpoint removal), ``reward`` the custom reward file, ``layout`` the GPU layout
of a run (``layout.schema.yaml`` its keys), ``preflight`` its own preflight checks, ``cost`` its price, ``metrics``
its TensorBoard scalars. DLC uses the
shared composite vLLM model (``calibrl.gpu.vllm_dlc``) and memory trainer (``calibrl.gpu.memory_actor``), whose
weights reach OpenRLHF's engines through ``memory_sync``.

No module here imports OpenRLHF, Ray, DeepSpeed or vLLM at module level, and the patch, hook and launcher modules
import only the standard library and calibrl (the DLC and reward modules import torch), so every module imports on a
CPU machine; the tests check the argv against OpenRLHF's real parser and the patches against its real code.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from calibrl.backends.openrlhf import layout as L
from calibrl.backends.openrlhf.command import ESTIMATORS
from calibrl.backends.openrlhf.gpu import OpenRLHFGpu
from calibrl.checkpoints import RunStamp
from calibrl.gpu import RAY_CLUSTER, hub_runs
from calibrl.runs import Run
from calibrl.spec import MethodSpec

log = logging.getLogger("calibrl.openrlhf")


class OpenRLHFBackend:
    name = "openrlhf"
    extends_runs = False  # OpenRLHF sizes its prompt stream from the run's length: another length is another run
    env = "../../envs/cluster-train.yaml"
    ignored = {
        "warmstart": "Hub models are the paper's starting points (no warm start)",
        "train.dapo_max_gen_batches": "OpenRLHF's dynamic sampling refills a batch until the data run out",
    }
    preload = ()  # its jobs run under SLURM in their own environment, never in the local job server
    gpu = OpenRLHFGpu()  # its venv, layout, SLURM request, rollout engine, preflight, price, checkpoint removal

    def problems(self, grid: dict, runs: list[tuple[Run, MethodSpec]]) -> list[tuple[str, str]]:
        out = hub_runs.problems(grid, runs, self.name)
        for spec in {spec.name: spec for _, spec in runs}.values():  # a method the trainer has no formula for
            if spec.estimator not in ESTIMATORS:
                what = f"{spec.estimator!r} has no OpenRLHF estimator (trainer openrlhf runs {sorted(ESTIMATORS)})"
                out.append((f"grid.methods.{spec.name}.estimator", what))
        if not out:  # the layouts can be computed
            out += L.problems(grid, [(run.model, spec.uses_kl, spec.uses_dlc) for run, spec in runs])
        return out

    def model_file(self, model: str, data: int) -> str:
        return hub_runs.model_file(model)

    def inputs(self, grid: dict, run: Run, spec: MethodSpec, data: int) -> dict[str, str]:
        return hub_runs.inputs(grid, run, spec)

    def segments(self, grid: dict, run: Run, spec: MethodSpec) -> list[int]:
        return hub_runs.segments(int(grid["train"]["steps"]), self.gpu.resources(grid, run, spec))

    def warmstart(self, params: dict, sft_path: str, model_dir: str, info_path: str, threads: int) -> None:
        raise NotImplementedError("trainer openrlhf starts from Hub models (rule download_model): no warm start")

    def train(self, settings_path: str, stop_at: int, threads: int, workers: int) -> None:
        """The run's prompt file, then the launcher inside a private Ray cluster with token authentication
        (``ray_cluster.sh``) spanning the job's allocation. The job and every Ray actor run offline
        (``HF_HUB_OFFLINE=1``), as compute nodes often are: the models are the login node's downloads."""
        from calibrl import offline
        from calibrl.backends.openrlhf.data import prepare
        from calibrl.backends.openrlhf.launch import PROMPTS
        from calibrl.checkpoints import MODEL_INPUTS
        from calibrl.model_store import verify_info

        offline.apply()  # inherited by ray_cluster.sh and the actors it starts
        stamp = RunStamp.read(settings_path)
        for name in MODEL_INPUTS:  # the login node's downloads, at the commits of the lock file
            if f"{name}_info" in stamp.paths:
                log.info("%s: %s at %s", name, stamp.paths[name], verify_info(stamp.paths[f"{name}_info"]))
        prepare(stamp, Path(settings_path).parent / PROMPTS)
        launch = [sys.executable, "-m", "calibrl.backends.openrlhf.launch", str(settings_path), str(int(stop_at))]
        argv = ["bash", str(RAY_CLUSTER), *launch]
        # Inside the executor's job step SLURM_GPUS_ON_NODE is that step's count: the layout's GPUs per node.
        env = {**os.environ, "RAY_GPUS_PER_NODE": str(int(stamp.resources["gpus_per_node"]))}
        # grid.workers (the rule's resources, no part of the run's identity): each rollout actor's grading pool
        # (reward.py), which the launcher passes on to every Ray worker
        env["CALIBRL_REWARD_WORKERS"] = str(int(workers))
        log.info("launching: %s", " ".join(argv))
        subprocess.run(argv, check=True, env=env)

    def metrics(self, run_dir: str, out_path: str) -> None:
        from calibrl.backends.openrlhf.metrics import tensorboard_metrics

        tensorboard_metrics(Path(run_dir).resolve() / "tensorboard", out_path)


BACKEND = OpenRLHFBackend()
