"""``python -m calibrl.backends.openrlhf.launch SETTINGS STOP_AT``: one segment of an OpenRLHF run.

``main`` reads the run's ``settings.json`` (``SETTINGS``; its folder is the run's) once
(``calibrl.checkpoints.RunStamp``) and

1. builds OpenRLHF's argv from it (``command.build_command``, the prompt file the job prepared beside it) and
   checks it with OpenRLHF's own parser and assertions (``command.check_openrlhf_argv``), and every symbol the
   run's patches wrap in the installed OpenRLHF (``hook.check``), before any GPU is touched;
2. repairs what a previous attempt killed mid-save left (``resume.repair``), writes the markers of the checkpoints
   it left (a resumed run), and stops there if the segment's last step (``STOP_AT``) is saved already;
3. records ``STOP_AT`` for the step limit (``steps.write_segment``), then starts Ray, or joins the cluster in
   ``RAY_ADDRESS`` (``ray_cluster.sh`` exports it), with ``hook.setup`` as every worker's
   ``worker_process_setup_hook`` and ``CALIBRL_SETTINGS`` (``checkpoints.SETTINGS_ENV``), the settings' path
   (beside it the grading pool's size and timeout, and a rehearsal's faults: :func:`runtime_env`). OpenRLHF's
   ``train()`` calls ``ray.init`` only when Ray is not initialised yet, so this runtime environment is the one
   every actor gets; OpenRLHF's own ``env_vars`` are passed on here for the same reason;
4. runs ``openrlhf.cli.train_ppo_ray`` as ``__main__`` (its parser exists only there), without its final full-model
   save (``skip_final_save``), under a watchdog that ends the launch once its TensorBoard files have not grown for
   the layout's ``stall_minutes`` (``calibrl.gpu.watchdog``);
5. writes one marker per Hugging Face checkpoint and fails if one of the ``eval_every`` steps up to ``STOP_AT`` has
   none.
"""

from __future__ import annotations

import logging
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

from calibrl import offline, plugins
from calibrl.backends.openrlhf import cpu_standins, hook, rehearsal_faults, resume, steps
from calibrl.backends.openrlhf.command import build_command, check_openrlhf_argv
from calibrl.checkpoints import SETTINGS_ENV, RunStamp
from calibrl.gpu import leftovers, watchdog
from calibrl.gpu.patching import Target, when_imported
from calibrl.runs import checkpoint_steps

log = logging.getLogger("calibrl.launch")

PROMPTS = "train_prompts.jsonl"  # the run's prepared prompt file (``data.prepare``), beside settings.json
_HF_DIR = re.compile(r"global_step(\d+)_hf")


# -------------------------------------------------------------------------------------------- markers
def hf_checkpoints(ckpt_dir: str | Path) -> dict[int, Path]:
    """Complete Hugging Face checkpoints OpenRLHF saved under ``ckpt_dir`` (``{ckpt.path}/global_step{k}_hf``,
    ppo_trainer.py L398, ppo_actor.py L675-681), by step (``resume.hf_complete``)."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return {}
    found = {}
    for path in root.iterdir():
        m = _HF_DIR.fullmatch(path.name)
        if m and path.is_dir() and resume.hf_complete(path):
            found[int(m.group(1))] = path
    return found


def write_markers(ckpt_dir: str | Path, marker_dir: str | Path, eval_every: int, steps: int) -> list[int]:
    """Write ``{marker_dir}/step_{k}.done`` (JSON: step, policy path, the run's fingerprint) for every evaluated
    step k with a checkpoint.

    The evaluated steps are ``eval_every, 2 * eval_every, ..., steps`` (``calibrl.runs.checkpoint_steps``);
    the marker matches the local trainer's (``{"step": k, "policy": <HF directory>}``). Idempotent: run it
    after training and on every (re)start. Returns the steps that have a marker now, including those whose
    checkpoint an evaluation has removed since (``calibrl.evaluate``, ``grid.retention``). The markers of a
    run trained with other settings are never seen here: ``calibrl.checkpoints.claim`` set them aside.
    """
    from calibrl.checkpoints import write_marker  # pandas: not imported by the workers that import this module

    if eval_every < 1 or steps < 1:
        raise ValueError(f"eval_every and steps must be >= 1, got {eval_every}, {steps}")
    found = hf_checkpoints(ckpt_dir)
    done = []
    for step in checkpoint_steps(eval_every, steps):
        marker = Path(marker_dir) / f"step_{step}.done"
        if step in found:
            write_marker(marker, step, found[step])
            done.append(step)
        elif marker.exists():  # evaluated, then its Hugging Face copy removed (grid.retention)
            done.append(step)
    return done


# --------------------------------------------------------------------------------------------- launch
def runtime_env(settings_path: str | Path) -> dict:
    """Ray's runtime environment: the setup hook and the one variable that names the run's settings (plus what
    ``train_ppo_ray.train()`` would have set, and the grading and Hub knobs of this job's environment: the reward
    file's pool size ``CALIBRL_REWARD_WORKERS``, which the training job sets from ``grid.workers``, reaches every
    rollout actor from here; ``reward.py`` refuses to load without it)."""
    src = str(Path(__file__).resolve().parents[3])  # the directory that holds the calibrl package
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = {
        SETTINGS_ENV: str(Path(settings_path).resolve()),
        "PYTHONPATH": path,
        # what train_ppo_ray.train() would have set, since our ray.init comes first
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
    }
    for name in ("CALIBRL_REWARD_WORKERS", "CALIBRL_REWARD_TIMEOUT", "HF_HOME", *offline.ENV):
        if name in os.environ:
            env[name] = os.environ[name]
    if os.environ.get(rehearsal_faults.ENV):  # the rehearsal's faults kill this process (launch.main checks)
        env[rehearsal_faults.ENV] = os.environ[rehearsal_faults.ENV]
        env[rehearsal_faults.DRIVER_ENV] = str(os.getpid())
    return {"worker_process_setup_hook": hook.SETUP_HOOK, "env_vars": env}


def openrlhf_argv(stamp: RunStamp) -> list[str]:
    """OpenRLHF's argv for the run of ``stamp`` (its settings.json), with the prompt file beside it (on a CPU
    rehearsal, less what the CPU cannot do: ``cpu_standins.cpu_argv``)."""
    run_dir = stamp.run_dir
    prompts = run_dir / PROMPTS
    with open(prompts, encoding="utf-8") as fh:
        rows = sum(1 for line in fh if line.strip())
    argv = build_command(stamp, run_dir, prompts, rows)
    return cpu_standins.cpu_argv(argv) if cpu_standins.enabled(stamp) else argv


FINAL_SAVE = Target("openrlhf.trainer.ray.launcher", "RayActorGroup.async_save_model", params=("self",))


def skip_final_save() -> None:
    """No full model in ``--ckpt.output_dir`` when ``fit`` returns (train_ppo_ray.py L191), which it does at every
    segment's end: the checkpoints of the ``eval_every`` steps are the run's models. Patched here, in the driver,
    where ``train()`` calls it (a plain class, looked up at call time)."""
    FINAL_SAVE.check()

    def make(original):
        def async_save_model(self):
            log.info("no final model save: the run's models are its step checkpoints")
            return []

        return async_save_model

    when_imported(FINAL_SAVE.module, lambda module: FINAL_SAVE.wrap(module, "final_save", make))


def ended_early(stamp: RunStamp, missing: list[int], ckpt_dir: Path) -> str:
    """What the log says when OpenRLHF's ``fit`` returned before the segment's last checkpoint."""
    text = f"training ended without the checkpoints of steps {missing} in {ckpt_dir}"
    if stamp.method.dynamic_sampling:  # the way a run ends early by itself: its passes over the prompts ran out
        text += (
            "; a DAPO run stops early when its dynamic sampling runs out of prompts: --train.num_episodes passes "
            "(command.DAPO_EPISODE_FACTOR times a plain run's) held too few groups whose samples do not all score "
            "the same. The log's 'Filtered out' lines show the groups it dropped (all 0.00: no sample right, the "
            "policy may have collapsed)"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        raise SystemExit("usage: python -m calibrl.backends.openrlhf.launch SETTINGS_JSON STOP_AT")
    settings_path, stop_at = Path(argv[0]).resolve(), int(argv[1])
    stamp = RunStamp.read(settings_path)
    steps_total, eval_every = int(stamp.train["steps"]), int(stamp.train["eval_every"])
    if not 0 < stop_at <= steps_total or stop_at % eval_every and stop_at != steps_total:
        raise ValueError(f"STOP_AT {stop_at} must be a checkpoint step (eval_every {eval_every}) <= {steps_total}")
    rest = openrlhf_argv(stamp)
    check_openrlhf_argv(rest)  # a typo fails here, not after the GPUs are allocated
    if os.environ.get(rehearsal_faults.ENV) and not cpu_standins.enabled(stamp):
        raise ValueError(f"{rehearsal_faults.ENV} is set: faults are injected only into a CPU rehearsal's runs")
    plugins.check()  # vLLM calls them in the rollout engines
    log.info("patches: %s", ", ".join(hook.check(stamp)))
    run_dir = settings_path.parent
    ckpt_dir = run_dir / "ckpt" / "openrlhf"

    resume.repair(ckpt_dir, run_dir / "ckpt", eval_every)  # what a job killed mid-save left
    done = write_markers(ckpt_dir, run_dir / "ckpt", eval_every, stop_at)
    if stop_at in done:
        log.info("step %d is already saved in %s: nothing to train", stop_at, ckpt_dir)
        return 0

    import ray

    steps.write_segment(run_dir, stop_at)
    skip_final_save()
    driver = hook.install_driver(stamp)  # Ray's setup hook never runs in this process
    log.info("patches in the driver: %s", ", ".join(driver) or "none")
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, runtime_env=runtime_env(settings_path))
    log.info("python -m openrlhf.cli.train_ppo_ray %s", shlex.join(rest))
    limit_s = 60 * float(stamp.resources["stall_minutes"])  # the run's TensorBoard files grow with every step
    stalled = watchdog.Watchdog(
        watchdog.folder_size(run_dir / "tensorboard"), limit_s, f"OpenRLHF's trainer of {stamp.run}"
    )
    try:
        saved = sys.argv
        sys.argv = ["train_ppo_ray", *rest]
        try:
            with stalled:
                runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
        finally:
            sys.argv = saved
    finally:
        ray.shutdown()
        leftovers.kill(settings_path, grace_s=leftovers.GRACE_S)  # engines an actor left (no cgroup ends them)

    done = write_markers(ckpt_dir, run_dir / "ckpt", eval_every, stop_at)
    missing = sorted(set(checkpoint_steps(eval_every, stop_at)) - set(done))
    if missing:
        log.error("%s", ended_early(stamp, missing, ckpt_dir))
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
