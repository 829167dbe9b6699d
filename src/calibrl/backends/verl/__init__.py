"""The verl backend: paper-scale training with verl 0.9.1 (the paper's own framework: its v1 trainer, FSDP2, vLLM
rollout replicas, Ray) on a GPU cluster, every method of the grid as verl configuration plus what it lacks.

A training job (``VerlBackend.train``) prepares the run's prompt file (``data``) and runs
``python -m calibrl.backends.verl.launch SETTINGS STOP_AT`` inside a private Ray cluster spanning the job's SLURM
allocation (``src/calibrl/gpu/ray_cluster.sh``). The launcher builds verl's Hydra overrides from the run's
settings.json (``command``) and runs ``verl.trainer.main_ppo`` with the external module (``external``) in every
process: the IAC estimators (``advantage``), the trainer mode that passes correctness to them, keeps the evaluated
Hugging Face checkpoints and trains DLC's memory (``trainer``, ``dlc``), and on a CPU rehearsal the CPU platform
(``cpu_platform``). ``reward`` is the reward function, ``layout`` the GPU layout (``layout.schema.yaml``), ``cost``
its price, ``metrics`` its logged scalars. The baselines are verl's own estimators and losses (``command``); the
tests check them against ``calibrl.algo`` through verl's real functions (tests/test_verl_parity.py).

Its environment is its own (``requirements-gpu.txt``, venv ``.venv-gpu-verl``): every verl since 0.9.0 caps
transformers below 5.11, which OpenRLHF 0.11.2's 5.15 pin excludes; it keeps the cluster's torch 2.13 and vLLM 0.29,
the vLLM the evaluation and DLC's composite model run on (docs/cluster.md, "verl").

No module here imports verl, Ray, vLLM or torch at module level, except those only verl's processes import
(``external``, ``trainer``, ``reward``), so the backend plans and checks configs in the main venv.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from calibrl.backends.verl import layout as L
from calibrl.backends.verl.advantage import ESTIMATORS
from calibrl.checkpoints import RunStamp
from calibrl.cost import RunCost, RunPlan
from calibrl.gpu import RAY_CLUSTER, hub_runs
from calibrl.gpu.retention import release_hf
from calibrl.runs import Run
from calibrl.spec import MethodSpec

log = logging.getLogger("calibrl.verl")
HERE = Path(__file__).parent


def cpu_platform_env() -> dict[str, str]:
    """What a CPU rehearsal's engine processes outside a run need to import verl (``cpu_external``)."""
    from calibrl.backends.verl import cpu_platform

    return {**cpu_platform.ENV, "VERL_USE_EXTERNAL_MODULES": "calibrl.backends.verl.cpu_external"}


class VerlGpu:
    """verl's GPU side: its layout, SLURM request, engines, preflight, price, checkpoint release and environment."""

    venv = ".venv-gpu-verl"
    requirements = "src/calibrl/backends/verl/requirements-gpu.txt"
    layout = L.SCHEMA

    def resources(self, grid: dict, run: Run, spec: MethodSpec) -> dict:
        return L.effective(grid["models"][run.model]["resources"], spec.uses_dlc)

    def request(self, grid: dict, run: Run, spec: MethodSpec) -> dict:
        return L.slurm_request(self.resources(grid, run, spec))

    def rollout_engine(self, train: dict, spec: MethodSpec, layout: dict, model: str, memory: str | None) -> dict:
        """verl's vLLM rollout replica for a run of this layout, as the preflight's ``vllm`` check starts it."""
        dlc = {"memory": memory, "mu": float(spec.dlc_mu)} if spec.uses_dlc else None
        return {
            "model": model,
            "tensor_parallel_size": int(layout["vllm_tensor_parallel_size"]),
            "sleep": True,  # the hybrid engine sleeps its replicas while FSDP trains (free_cache_engine)
            "gpu_memory_utilization": float(layout["vllm_gpu_memory_utilization"]),
            "prefix_caching": bool(layout["prefix_caching"]),
            "enforce_eager": False,  # verl's rollout default: CUDA graphs
            "max_model_len": int(train["max_prompt_len"]) + int(train["max_new_tokens"]),
            "dtype": "bfloat16",
            "worker_extension": "calibrl.backends.verl.dlc.DLCWorkerExtension"
            if dlc
            else "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension",
            "logprobs_mode": None,
            "dlc": dlc,
            # the worker extension imports verl in the engine's processes; on a CPU rehearsal verl needs its platform
            "env": cpu_platform_env() if layout.get("cpu_rehearsal") else {},
        }

    def preflight_checks(self) -> dict:
        """The training canary: each kind of run of the shape trains 2 steps through ``main_ppo``, saves and resumes
        (``calibrl.gpu.canary``); verl has no flash-attn or optimizer kernel of calibrl's to check."""
        from calibrl.backends import canary_check
        from calibrl.backends.verl.dlc import CHECK_TOLERANCE
        from calibrl.gpu.canary import Trainer

        return {"canary": canary_check(Trainer("calibrl.backends.verl", CHECK_TOLERANCE, clip="actor/pg_clipfrac"))}

    def vllm_plugin(self, stamp: RunStamp) -> None:
        """A CPU rehearsal's platform and stand-ins in vLLM's processes; on a cluster, nothing."""
        if (stamp.resources or {}).get("cpu_rehearsal"):
            from calibrl.backends.verl import cpu_platform
            from calibrl.gpu import vllm_cpu

            cpu_platform.install()
            vllm_cpu.install()  # verl pushes the actor's weights into the engines after every step

    def train_cost(self, plan: RunPlan, a: dict) -> RunCost:
        from calibrl.backends.verl.cost import train_cost

        return train_cost(plan, a)

    def release(self, policy_dir: str, step: int, keep_steps: list[int]) -> bool:
        return release_hf(policy_dir, step, keep_steps)  # its evaluated copies are global_step{k}_hf folders


class VerlBackend:
    name = "verl"
    extends_runs = False  # the run's length sizes verl's passes over the data: another length is another run
    env = "../../src/calibrl/backends/verl/environment.yaml"
    ignored = {
        "warmstart": "Hub models are the paper's starting points (no warm start)",
        "train.dapo_max_gen_batches": "verl 0.9.1's v1 replay buffer ignores max_num_gen_batches: it refills a "
        "DAPO batch until the data run out",
    }
    preload = ()  # its jobs run under SLURM in their own environment
    gpu = VerlGpu()

    def problems(self, grid: dict, runs: list[tuple[Run, MethodSpec]]) -> list[tuple[str, str]]:
        out = hub_runs.problems(grid, runs, self.name)
        if not grid["chat_template"]:
            out.append(("grid.chat_template", "trainer verl applies the model's chat template to every prompt"))
        if grid["train"]["weight_decay_scope"] != "all":
            out.append(("grid.train.weight_decay_scope", "verl's AdamW decays every parameter (scope all only)"))
        for spec in {spec.name: spec for _, spec in runs}.values():
            if spec.estimator not in ESTIMATORS:
                what = f"{spec.estimator!r} has no verl estimator (trainer verl runs {sorted(ESTIMATORS)})"
                out.append((f"grid.methods.{spec.name}.estimator", what))
            if spec.dlc_importance not in (None, "none"):
                out.append(("grid.train.dlc_importance", f"{spec.dlc_importance!r}: trainer verl runs DLC without "
                                                         "an importance correction (none) only"))  # fmt: skip
        if not out:
            out += L.problems(grid, [(run.model, spec.uses_dlc) for run, spec in runs])
        return out

    def model_file(self, model: str, data: int) -> str:
        return hub_runs.model_file(model)

    def inputs(self, grid: dict, run: Run, spec: MethodSpec, data: int) -> dict[str, str]:
        return hub_runs.inputs(grid, run, spec)

    def segments(self, grid: dict, run: Run, spec: MethodSpec) -> list[int]:
        return hub_runs.segments(int(grid["train"]["steps"]), self.gpu.resources(grid, run, spec))

    def warmstart(self, params: dict, sft_path: str, model_dir: str, info_path: str, threads: int) -> None:
        raise NotImplementedError("trainer verl starts from Hub models (rule download_model): no warm start")

    def train(self, settings_path: str, stop_at: int, threads: int, workers: int) -> None:
        """The run's prompt file, then the launcher inside a private Ray cluster (``ray_cluster.sh``) spanning the
        job's allocation, offline (``HF_HUB_OFFLINE=1``): the models are the login node's downloads."""
        from calibrl import offline
        from calibrl.backends.verl.data import PROMPTS, prepare

        offline.apply()
        stamp = RunStamp.read(settings_path)
        prepare(stamp, Path(settings_path).parent / PROMPTS)
        launch = [sys.executable, "-m", "calibrl.backends.verl.launch", str(settings_path), str(int(stop_at))]
        env = {**os.environ, "RAY_GPUS_PER_NODE": str(int(stamp.resources["gpus_per_node"]))}
        env["CALIBRL_REWARD_WORKERS"] = str(int(workers))
        argv = ["bash", str(RAY_CLUSTER), *launch]
        log.info("launching: %s", " ".join(argv))
        subprocess.run(argv, check=True, env=env)

    def metrics(self, run_dir: str, out_path: str) -> None:
        from calibrl.backends.verl.command import ckpt_dir
        from calibrl.backends.verl.launch import METRICS
        from calibrl.backends.verl.metrics import file_metrics

        file_metrics(ckpt_dir(run_dir) / METRICS, out_path)


BACKEND = VerlBackend()
