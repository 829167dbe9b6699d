"""OpenRLHF's GPU side (``OpenRLHFBackend.gpu``, a ``calibrl.backends.GpuSide``): the venv its SLURM jobs run in
and the requirements that make it, a run's layout (``layout``) and the SLURM request that gives it, its vLLM rollout
engine, its preflight checks (``preflight``, ``canary``), the vLLM-side stand-ins of a CPU rehearsal
(``cpu_standins``), its price (``cost``) and the removal of its evaluated checkpoints."""

from __future__ import annotations

import logging

from calibrl.backends.openrlhf import layout as L
from calibrl.checkpoints import RunStamp
from calibrl.cost import RunCost, RunPlan
from calibrl.gpu.retention import release_hf
from calibrl.runs import Run
from calibrl.spec import MethodSpec

log = logging.getLogger("calibrl.openrlhf")


class OpenRLHFGpu:
    venv = ".venv-gpu"  # scripts/cluster_env.sh build openrlhf makes it (the default trainer there)
    requirements = "envs/cluster-gpu.txt"  # torch, vLLM, OpenRLHF 0.11.2's own requirements, the job-step plugin
    layout = L.SCHEMA  # grid.models.<name>.resources: layout.schema.yaml beside it

    def request(self, grid: dict, run: Run, spec: MethodSpec) -> dict:
        return L.slurm_request(self.resources(grid, run, spec))

    def resources(self, grid: dict, run: Run, spec: MethodSpec) -> dict:
        return L.effective(grid["models"][run.model]["resources"], spec.uses_dlc)

    def rollout_engine(self, train: dict, spec: MethodSpec, layout: dict, model: str, memory: str | None) -> dict:
        """OpenRLHF's vLLM rollout engine for a run of this layout (``create_vllm_engines``' arguments)."""
        from calibrl.backends.openrlhf import dlc as dlc_patch  # its patch_engines names DLCWorkerWrap so

        res = L.run_roles(layout, spec)["resources"]
        dlc = {"memory": memory, "mu": float(spec.dlc_mu)} if spec.uses_dlc else None
        wrap = f"{dlc_patch.__name__}.DLCWorkerWrap" if dlc else "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"
        return {
            "model": model,
            "tensor_parallel_size": int(res["vllm_tensor_parallel_size"]),
            "sleep": bool(res["colocate_all"]),  # --vllm.enable_sleep, given with --train.colocate_all (command.py)
            "gpu_memory_utilization": float(res["vllm_gpu_memory_utilization"]),
            "prefix_caching": bool(res["prefix_caching"]),
            "enforce_eager": "--vllm.enforce_eager" in [str(a) for a in res["extra_args"]],  # OpenRLHF's default
            "max_model_len": int(train["max_prompt_len"]) + int(train["max_new_tokens"]),  # --data.max_len
            "dtype": "bfloat16",  # create_vllm_engines' own
            "worker_extension": wrap,  # dlc.patch_engines sets DLC's
            # train_ppo_ray: processed logprobs where an importance correction is on (command.py: DLC, truncated)
            "logprobs_mode": "processed_logprobs" if spec.dlc_importance == "truncated" else None,
            "dlc": dlc,
        }

    def preflight_checks(self) -> dict:
        """Its model code with flash-attn's kernel, DeepSpeed's optimizer with calibrl's kernel, and the training
        canary: each kind of run of the shape trains 2 steps, saves and resumes (``canary``)."""
        from calibrl.backends import canary_check
        from calibrl.backends.openrlhf import preflight
        from calibrl.backends.openrlhf.dlc import CHECK_TOLERANCE
        from calibrl.gpu.canary import Trainer

        canary = Trainer("calibrl.backends.openrlhf", dlc_tolerance=CHECK_TOLERANCE, clip="ppo_clip_ratio")
        return {"flash_attn": preflight.flash_attn, "optimizer": preflight.optimizer, "canary": canary_check(canary)}

    def vllm_plugin(self, stamp: RunStamp) -> None:
        """A CPU rehearsal's vLLM-side stand-ins (``cpu_standins``); on a cluster, nothing."""
        from calibrl.backends.openrlhf import cpu_standins

        cpu_standins.vllm_plugin(stamp)

    def train_cost(self, plan: RunPlan, a: dict) -> RunCost:
        from calibrl.backends.openrlhf.cost import train_cost

        return train_cost(plan, a)

    def release(self, policy_dir: str, step: int, keep_steps: list[int]) -> bool:
        return release_hf(policy_dir, step, keep_steps)  # its evaluated copies are global_step{k}_hf folders
