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
from calibrl.gpu import RAY_CLUSTER
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
        out = []
        if grid["data"]["source"] == "countdown":
            out.append(("grid.data.source", "countdown goes with grid.trainer local (tiny models)"))
        for kind in ("models", "memory_models"):
            for name, spec in grid[kind].items():
                if "hf_id" not in spec:
                    out.append((f"grid.{kind}.{name}", "trainer openrlhf needs hf_id (a Hugging Face model)"))
        batch = grid["train"]["prompts_per_step"]
        for spec in {spec.name: spec for _, spec in runs}.values():  # a method the trainer has no formula for
            if spec.shuffle_rewards:
                out.append((f"grid.methods.{spec.name}.shuffle_rewards", "the control arm runs on trainer local only"))
            if spec.estimator not in ESTIMATORS:
                what = f"{spec.estimator!r} has no OpenRLHF estimator (trainer openrlhf runs {sorted(ESTIMATORS)})"
                out.append((f"grid.methods.{spec.name}.estimator", what))
            if "subset" in grid["data"]:  # a smoke run's rows: OpenRLHF needs one step's prompts (command.py)
                rows = grid["data"]["subset"]
                kept = rows - round(spec.filter_easiest * rows)  # calibrl.algo.filtering.keep_indices
                if kept < batch:
                    why = f", {kept} after method {spec.name}'s filter_easiest {spec.filter_easiest:g}," * spec.filters
                    out.append(("grid.data.subset", f"{rows} training rows{why} are fewer than one step's "
                                                    f"{batch} prompts (grid.train.prompts_per_step)"))  # fmt: skip
        if batch % grid["train"]["ppo_minibatches"]:  # command.train_samples: whole groups per optimizer step
            what = f"does not divide grid.train.prompts_per_step ({batch}): each optimizer step takes whole groups"
            out.append(("grid.train.ppo_minibatches", what))
        for name, spec in grid["models"].items():
            if "resources" not in spec:  # a tiny model (refused above)
                continue
            resources = spec["resources"]
            for key, lay in (("resources", resources), ("resources.dlc", resources["dlc"])):
                every, evals = lay.get("segment_steps"), grid["train"]["eval_every"]
                if every and every % evals:
                    what = f"{every} is not a multiple of grid.train.eval_every ({evals})"
                    out.append((f"grid.models.{name}.{key}.segment_steps", what + ": a segment ends on a checkpoint"))
                saves = lay.get("ds_save_steps")
                if saves and evals % saves:
                    what = f"{saves} does not divide grid.train.eval_every ({evals}): an evaluated step needs its state"
                    out.append((f"grid.models.{name}.{key}.ds_save_steps", what))
        if not out:  # the layouts can be computed
            out += L.problems(grid, [(run.model, spec.uses_kl, spec.uses_dlc) for run, spec in runs])
        return out

    def model_file(self, model: str, data: int) -> str:
        return f"models/{model}/hub.json"  # rule download_model, on the login node: one for every data seed

    def inputs(self, grid: dict, run: Run, spec: MethodSpec, data: int) -> dict[str, str]:
        out = {"init": self.model_file(run.model, data)}
        if spec.uses_dlc:
            out["memory"] = self.model_file(grid["models"][run.model]["memory"], data)
        if spec.filters:  # ranked by the initial model with vLLM, once per model (rule rank_train)
            out["success"] = f"models/{run.model}/train_success.json"
        return out

    def segments(self, grid: dict, run: Run, spec: MethodSpec) -> list[int]:
        """Every ``segment_steps`` of the run's layout (a multiple of ``eval_every``; unset: one job) and ``steps``:
        each segment is one SLURM job resuming from the previous one's checkpoint, so a run longer than a SLURM time
        limit still finishes."""
        steps = int(grid["train"]["steps"])
        every = int(self.gpu.resources(grid, run, spec).get("segment_steps") or steps)
        return sorted({*range(every, steps, every), steps})

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
