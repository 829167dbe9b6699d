"""``python -m calibrl.backends.verl.launch SETTINGS STOP_AT``: one segment of a verl run.

``main`` reads the run's ``settings.json`` (``SETTINGS``; its folder is the run's) once and

1. builds verl's Hydra overrides from it (``command.build_overrides``, the prompt file the job prepared beside it)
   and composes verl's config from them (``command.check_overrides``) before Ray starts;
2. repairs what a killed attempt left (:func:`repair`), writes the markers of the checkpoints there are, and stops
   if ``STOP_AT`` is saved already;
3. joins the job's Ray cluster (``RAY_ADDRESS``, exported by ``ray_cluster.sh``) with the run's variables in every
   worker's environment (:func:`runtime_env`: the external module, the settings, the grading pool, verl's own);
   ``main_ppo`` calls ``ray.init`` only where Ray is not initialised, so this runtime environment is every actor's;
4. runs ``verl.trainer.main_ppo`` as ``__main__`` up to ``STOP_AT`` (``trainer.total_training_steps``), resuming
   from verl's last saved state (``trainer.resume_mode=auto``), under a watchdog that ends the launch once no step
   has been logged for the layout's ``stall_minutes`` (``calibrl.gpu.watchdog``);
5. writes one marker per Hugging Face checkpoint and fails if an evaluated step up to ``STOP_AT`` has none.
"""

from __future__ import annotations

import logging
import os
import re
import runpy
import shlex
import shutil
import sys
import time
from pathlib import Path

from calibrl import offline, plugins
from calibrl.backends.verl import cpu_platform
from calibrl.backends.verl.command import build_overrides, check_overrides, ckpt_dir
from calibrl.backends.verl.data import PROMPTS
from calibrl.backends.verl.hf_copies import HF, evaluated_steps, hf_target, keep_hf
from calibrl.checkpoints import SETTINGS_ENV, RunStamp
from calibrl.gpu import faults, leftovers, watchdog
from calibrl.runs import checkpoint_steps

log = logging.getLogger("calibrl.verl.launch")

EXTERNAL = "calibrl.backends.verl.external"
METRICS = "metrics"
"""verl's file logger writes one JSON-lines file per launch here, under the run's ``default_local_dir``."""
_HF_DIR = re.compile(r"global_step(\d+)_hf")
_STATE_DIR = re.compile(r"global_step_(\d+)")


TRACKER = "latest_checkpointed_iteration.txt"


def saved_step(ckpt: Path) -> int:
    """The last step whose resume state verl completed (its tracker, written after the save), 0 if none."""
    tracker = ckpt / TRACKER
    return int(tracker.read_text().strip()) if tracker.is_file() else 0


def repair(ckpt: Path, stamp: RunStamp) -> None:
    """What a killed attempt left. An evaluated step whose state verl saved but whose Hugging Face copy the trainer had
    not yet moved (the job died between the two, before the step's metrics were logged) is discarded and verl's
    tracker rewound to the state before it, which the retry trains from again, as OpenRLHF's repair discards a
    DeepSpeed tag without its copy; other completed saves' copies are moved or removed (``hf_copies.keep_hf``)."""

    last, evaluated = saved_step(ckpt), evaluated_steps(stamp)
    states = sorted(int(m[1]) for p in ckpt.glob("global_step_*") if (m := _STATE_DIR.fullmatch(p.name)))
    if last and last in evaluated and not hf_target(ckpt, last).is_dir():
        earlier = [k for k in states if k < last]
        shutil.rmtree(ckpt / f"global_step_{last}")
        tracker = ckpt / TRACKER
        if earlier:
            tracker.write_text(str(earlier[-1]))
        else:
            tracker.unlink()
        log.warning("step %d was saved without its Hugging Face copy (a killed job): discarded; verl resumes from %s",
                    last, f"step {earlier[-1]}" if earlier else "scratch")  # fmt: skip
        last = earlier[-1] if earlier else 0
    for step in states:
        if step <= last:
            keep_hf(ckpt, step, evaluated)


def write_markers(ckpt: Path, marker_dir: Path, eval_every: int, steps: int) -> list[int]:
    """``{marker_dir}/step_{k}.done`` for every evaluated step k up to ``steps`` with a Hugging Face checkpoint in
    ``ckpt/hf``; returns the steps with a marker (those an evaluation removed since included). Idempotent."""
    from calibrl.checkpoints import write_marker

    found = {}
    if (ckpt / HF).is_dir():
        for path in (ckpt / HF).iterdir():
            m = _HF_DIR.fullmatch(path.name)
            if m and (path / "config.json").is_file():
                found[int(m[1])] = path
    done = []
    for step in checkpoint_steps(eval_every, steps):
        marker = marker_dir / f"step_{step}.done"
        if step in found:
            write_marker(marker, step, found[step])
            done.append(step)
        elif marker.exists():  # evaluated, then removed (grid.retention)
            done.append(step)
    return done


def run_env(stamp: RunStamp, settings_path: Path, ckpt: Path) -> dict[str, str]:
    """The variables every process of the run needs: this module's and verl's external module, the settings, the
    grading pool, the metrics file of this launch, the Hub's offline switches, a CPU rehearsal's platform."""
    src = str(Path(__file__).resolve().parents[3])  # the directory that holds the calibrl package
    env = {
        "VERL_USE_EXTERNAL_MODULES": EXTERNAL,
        SETTINGS_ENV: str(settings_path),
        "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p),
        "VERL_FILE_LOGGER_PATH": str(ckpt / METRICS / f"launch-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl"),
        "TRANSFER_QUEUE_ENABLE": "1",  # main_ppo sets it where it starts Ray itself
        # SLURM sets ROCR_VISIBLE_DEVICES beside CUDA_VISIBLE_DEVICES for a GPU gres (unless gres.conf's Flags say
        # nvidia_gpu_env only), the Ray nodes' srun steps pass it to every actor, and verl's workers refuse both
        # (single_controller/base/worker.py, _setup_env_cuda_visible_devices): empty, it is unset to verl and CUDA
        "ROCR_VISIBLE_DEVICES": "",
    }
    for name in ("CALIBRL_REWARD_WORKERS", "CALIBRL_REWARD_TIMEOUT", "HF_HOME", "VLLM_CPU_KVCACHE_SPACE",
                 *offline.ENV):  # fmt: skip
        if name in os.environ:
            env[name] = os.environ[name]
    if (stamp.resources or {}).get("cpu_rehearsal"):
        env.update(cpu_platform.ENV)
    if os.environ.get(faults.ENV):  # the rehearsal's faults kill this process (main checks it is a rehearsal)
        env[faults.ENV], env[faults.DRIVER_ENV] = os.environ[faults.ENV], str(os.getpid())
    return env


def runtime_env(env: dict[str, str]) -> dict:
    """Ray's runtime environment: verl's own (``get_ppo_ray_runtime_env``, which ``main_ppo`` would have passed)
    with the run's variables."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    base = get_ppo_ray_runtime_env()
    return {**base, "env_vars": {**base.get("env_vars", {}), **env}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        raise SystemExit("usage: python -m calibrl.backends.verl.launch SETTINGS_JSON STOP_AT")
    settings_path, stop_at = Path(argv[0]).resolve(), int(argv[1])
    stamp = RunStamp.read(settings_path)
    steps_total, eval_every = int(stamp.train["steps"]), int(stamp.train["eval_every"])
    if not 0 < stop_at <= steps_total or stop_at % eval_every and stop_at != steps_total:
        raise ValueError(f"STOP_AT {stop_at} must be a checkpoint step (eval_every {eval_every}) <= {steps_total}")
    if os.environ.get(faults.ENV) and not (stamp.resources or {}).get("cpu_rehearsal"):
        raise ValueError(f"{faults.ENV} is set: faults are injected only into a CPU rehearsal's runs")
    run_dir = settings_path.parent
    ckpt = ckpt_dir(run_dir)
    prompts = run_dir / PROMPTS
    import pandas as pd

    rows = len(pd.read_parquet(prompts, columns=["data_source"]))
    env = run_env(stamp, settings_path, ckpt)
    os.environ.update(env)  # this process imports verl too (the config check below): the external module runs
    overrides = build_overrides(stamp, run_dir, prompts, rows, stop_at)
    if (stamp.resources or {}).get("cpu_rehearsal"):
        overrides = cpu_platform.cpu_overrides(overrides)
    check_overrides(overrides)  # a bad key or value fails here, before Ray
    plugins.check()  # vLLM calls them in the rollout engines

    repair(ckpt, stamp)
    done = write_markers(ckpt, run_dir / "ckpt", eval_every, stop_at)
    if stop_at in done and saved_step(ckpt) >= stop_at:
        log.info("step %d is already saved in %s: nothing to train", stop_at, ckpt)
        return 0

    import ray

    (ckpt / METRICS).mkdir(parents=True, exist_ok=True)
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, runtime_env=runtime_env(env))
    hydra = [f"hydra.run.dir={ckpt / 'hydra'}", "hydra.output_subdir=null"]
    log.info("python -m verl.trainer.main_ppo %s", shlex.join(overrides))
    # verl's file logger writes a line a step, unbuffered: a launch whose file stops growing is waiting on a dead worker
    limit_s = 60 * float(stamp.resources["stall_minutes"])
    stalled = watchdog.Watchdog(
        watchdog.file_size(env["VERL_FILE_LOGGER_PATH"]), limit_s, f"verl's trainer of {stamp.run}"
    )
    try:
        saved = sys.argv
        sys.argv = ["main_ppo", *overrides, *hydra]
        try:
            with stalled:
                runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)
        finally:
            sys.argv = saved
    finally:
        ray.shutdown()
        leftovers.kill(settings_path, grace_s=leftovers.GRACE_S)  # engines an actor left (no cgroup ends them)

    repair(ckpt, stamp)
    done = write_markers(ckpt, run_dir / "ckpt", eval_every, stop_at)
    missing = sorted(set(checkpoint_steps(eval_every, stop_at)) - set(done))
    if missing:
        log.error("training ended without the checkpoints of steps %s in %s", missing, ckpt / HF)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
