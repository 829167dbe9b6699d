"""``python -m calibrl.train.openrlhf.launch [--calibrl.* flags] [OpenRLHF flags]``: one OpenRLHF run.

``main(argv)``:

1. takes the ``--calibrl.*`` flags (``command.CALIBRL_FLAGS``) out of ``argv`` and checks the rest with
   OpenRLHF's own parser and assertions (``command.check_openrlhf_argv``), before any GPU is touched;
2. writes the markers of the checkpoints a previous attempt left (a resumed run), and stops there if the
   last one exists;
3. starts Ray, or joins the cluster in ``RAY_ADDRESS`` (``ray_cluster.sh`` exports it), with
   ``calibrl.train.openrlhf.iac_patch.apply`` as every worker's ``worker_process_setup_hook`` and the
   settings in ``env_vars`` (``CALIBRL_IAC_ALPHA``, ``CALIBRL_MAX_STEPS``, the ``PYTHONPATH`` that finds
   calibrl). OpenRLHF's ``train()`` calls ``ray.init`` only when Ray is not initialised yet
   (train_ppo_ray.py L21), so this runtime environment is the one every actor gets; OpenRLHF's own
   ``env_vars`` (L25-31) are passed on here for the same reason;
4. runs ``openrlhf.cli.train_ppo_ray`` as ``__main__`` (its parser exists only there) with the rest of argv;
5. writes one marker per Hugging Face checkpoint and fails if one of the ``eval_every`` steps up to
   ``max_steps`` has none.

The step limit. OpenRLHF has no max-steps flag and DAPO's dynamic filtering consumes a data-dependent
number of prompts per step, so ``limit_steps`` (installed by the setup hook when ``CALIBRL_MAX_STEPS`` is
set) makes the trainer stop after exactly that many steps and never train on a partial batch: the
``SamplesGenerator`` of 0.11.2 (``samples_generator.py`` L88-138) returns fewer than
``rollout.batch_size * n_samples_per_prompt`` samples only at the end of a pass over the data.

DLC (``--calibrl.dlc_mu`` > 0, with ``--calibrl.dlc_memory`` and ``--calibrl.dlc_memory_lr``): the settings
reach every worker as ``CALIBRL_DLC_*`` variables and the setup hook installs ``openrlhf_dlc`` (composite vLLM
engines, the memory actor's step after each policy step, its weight sync and checkpoints).
"""

from __future__ import annotations

import logging
import os
import re
import runpy
import sys
from pathlib import Path
from types import ModuleType

from calibrl.train.openrlhf.command import check_openrlhf_argv, split_calibrl

log = logging.getLogger("calibrl.launch")

SETUP_HOOK = "calibrl.train.openrlhf.iac_patch.apply"
_HF_DIR = re.compile(r"global_step(\d+)_hf")


# -------------------------------------------------------------------------------------------- markers
def hf_checkpoints(ckpt_dir: str | Path) -> dict[int, Path]:
    """Complete Hugging Face checkpoints OpenRLHF saved under ``ckpt_dir``, by step.

    0.11.2 saves ``{ckpt.path}/global_step{k}_hf`` (ppo_trainer.py L398, ppo_actor.py L675-681) with
    ``save_pretrained`` (weights, then config) and the tokenizer last (utils/deepspeed/deepspeed.py
    L583-589): a directory counts once its config, tokenizer config and weights (or weight index) exist.
    """
    found = {}
    root = Path(ckpt_dir)
    if not root.is_dir():
        return found
    for path in root.iterdir():
        m = _HF_DIR.fullmatch(path.name)
        if not (m and path.is_dir()):
            continue
        weights = any(
            (path / w).exists()
            for w in (
                "model.safetensors",
                "model.safetensors.index.json",
                "pytorch_model.bin",
                "pytorch_model.bin.index.json",
            )
        )
        if weights and (path / "config.json").exists() and (path / "tokenizer_config.json").exists():
            found[int(m.group(1))] = path
    return found


def write_markers(ckpt_dir: str | Path, marker_dir: str | Path, eval_every: int, steps: int) -> list[int]:
    """Write ``{marker_dir}/step_{k}.done`` (JSON: step, policy path, the run's fingerprint) for every evaluated
    step k with a checkpoint.

    The evaluated steps are ``eval_every, 2 * eval_every, ..., steps``, as ``calibrl.grid.eval_steps``;
    the marker matches the local trainer's (``{"step": k, "policy": <HF directory>}``). Idempotent: run it
    after training and on every (re)start. Returns the steps that have a marker now, including those whose
    checkpoint an evaluation has removed since (``calibrl.evaluate``, ``grid.retention``). The markers of a
    run trained with other settings are never seen here: ``calibrl.checkpoints.claim`` set them aside.
    """
    from calibrl.checkpoints import write_marker  # pandas: not imported by the workers that import this module
    from calibrl.grid import checkpoint_steps

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


# ----------------------------------------------------------------------------------------- step limit
def limit_steps(module: ModuleType) -> None:
    """Patch ``openrlhf.trainer.ppo_trainer`` to stop after ``CALIBRL_MAX_STEPS`` full steps (once).

    * ``SamplesGenerator.generate_samples`` returns "no samples, data exhausted" once the limit is reached,
      which ends ``PPOTrainer.fit``'s loops (ppo_trainer.py L520-573; the exit is L535-537), and drops a
      batch smaller than one step's (the end of a pass; it would make a smaller, misaligned optimizer step);
    * ``BasePPOTrainer.train_step`` sets the stop when the step it returns (L264) reaches the limit;
    * ``BasePPOTrainer.init_checkpoint_states`` sets it when a resumed checkpoint is already there.
    """
    limit = int(os.environ["CALIBRL_MAX_STEPS"])
    trainer, generator = getattr(module, "BasePPOTrainer", None), getattr(module, "SamplesGenerator", None)
    names = ("train_step", "init_checkpoint_states")
    if (
        trainer is None
        or generator is None
        or not all(hasattr(trainer, n) for n in names)
        or not hasattr(generator, "generate_samples")
    ):
        raise RuntimeError(f"{module.__name__} changed shape: the step limit cannot be installed")
    if getattr(generator.generate_samples, "__calibrl_steps__", False):
        return

    original_generate = generator.generate_samples
    original_train_step = trainer.train_step
    original_init = trainer.init_checkpoint_states

    def generate_samples(self, **kwargs):
        if getattr(self, "_calibrl_stop", False):
            return [], None, 0, True
        samples, pass_rate, consumed, exhausted = original_generate(self, **kwargs)
        full = self.args.rollout.batch_size * self.args.rollout.n_samples_per_prompt
        if samples and len(samples) < full:
            log.warning("dropping a partial batch of %d samples (a step takes %d)", len(samples), full)
            samples = []
        return samples, pass_rate, consumed, exhausted

    def stop(self, step: int) -> None:
        if step >= limit:
            self.samples_generator._calibrl_stop = True
            log.info("step limit %d reached at step %d: stopping", limit, step)

    def train_step(self, rollout_samples, global_step):
        status, step = original_train_step(self, rollout_samples, global_step)
        stop(self, step)
        return status, step

    def init_checkpoint_states(self):
        states = original_init(self)
        stop(self, int(states.get("global_step", 0)))
        return states

    for fn, orig in (
        (generate_samples, original_generate),
        (train_step, original_train_step),
        (init_checkpoint_states, original_init),
    ):
        fn.__wrapped__, fn.__doc__, fn.__calibrl_steps__ = orig, orig.__doc__, True
    generator.generate_samples = generate_samples
    trainer.train_step = train_step
    trainer.init_checkpoint_states = init_checkpoint_states


# --------------------------------------------------------------------------------------------- launch
def _flag(argv: list[str], name: str) -> str | None:
    """The value of OpenRLHF flag ``name`` in ``argv`` (last one wins), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def runtime_env(iac_alpha: float, max_steps: int, dlc: dict[str, str] | None = None, loss_norm_len: int = 0) -> dict:
    """Ray's runtime environment: the setup hook and the variables every worker needs (``dlc``: DLC's;
    ``loss_norm_len``: Dr. GRPO's constant normaliser, ``loss_norm``)."""
    src = str(Path(__file__).resolve().parents[3])  # the directory that holds the calibrl package
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = {
        "CALIBRL_IAC_ALPHA": repr(float(iac_alpha)),
        "CALIBRL_MAX_STEPS": str(int(max_steps)),
        "PYTHONPATH": path,
        # what train_ppo_ray.train() would have set (L25-31), since our ray.init comes first
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
        "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1"),
        **(dlc or {}),
        **({"CALIBRL_LOSS_NORM_LEN": str(int(loss_norm_len))} if loss_norm_len else {}),
    }
    for name in ("CALIBRL_REWARD_WORKERS", "CALIBRL_REWARD_TIMEOUT", "HF_HOME", "HF_HUB_OFFLINE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return {"worker_process_setup_hook": SETUP_HOOK, "env_vars": env}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = split_calibrl(argv)
    iac_alpha = float(ours.get("iac_alpha", 0.0))
    dlc_mu = float(ours.get("dlc_mu", 0.0))
    if iac_alpha < 0 or dlc_mu < 0:
        raise ValueError(f"--calibrl.iac_alpha and --calibrl.dlc_mu must be >= 0, got {iac_alpha}, {dlc_mu}")
    dlc = None
    if dlc_mu > 0:
        missing = [f"--calibrl.{k}" for k in ("dlc_memory", "dlc_memory_lr") if not ours.get(k)]
        if missing:
            raise ValueError(f"--calibrl.dlc_mu {dlc_mu} (DLC) needs {' and '.join(missing)}")
        if not float(ours["dlc_memory_lr"]) > 0:
            raise ValueError(f"--calibrl.dlc_memory_lr must be > 0, got {ours['dlc_memory_lr']}")
        dlc = {
            "CALIBRL_DLC_MU": repr(dlc_mu),
            "CALIBRL_DLC_MEMORY": ours["dlc_memory"],
            "CALIBRL_DLC_MEMORY_LR": repr(float(ours["dlc_memory_lr"])),
        }
    for key in ("max_steps", "eval_every", "marker_dir"):
        if key not in ours:
            raise ValueError(f"--calibrl.{key} is required")
    max_steps, eval_every, marker_dir = int(ours["max_steps"]), int(ours["eval_every"]), ours["marker_dir"]
    check_openrlhf_argv(rest)  # a typo fails here, not after the GPUs are allocated
    ckpt_dir = _flag(rest, "--ckpt.path")
    if ckpt_dir is None:
        raise ValueError("--ckpt.path is required (checkpoints and markers live there)")

    done = write_markers(ckpt_dir, marker_dir, eval_every, max_steps)
    if max_steps in done:
        log.info("step %d is already saved in %s: nothing to train", max_steps, ckpt_dir)
        return 0

    import ray

    address = os.environ.get("RAY_ADDRESS") or None
    env = runtime_env(iac_alpha, max_steps, dlc, int(ours.get("loss_norm_len", 0)))
    ray.init(address=address, runtime_env=env)
    try:
        saved = sys.argv
        sys.argv = ["train_ppo_ray", *rest]
        try:
            runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
        finally:
            sys.argv = saved
    finally:
        ray.shutdown()

    done = write_markers(ckpt_dir, marker_dir, eval_every, max_steps)
    from calibrl.grid import checkpoint_steps

    missing = sorted(set(checkpoint_steps(eval_every, max_steps)) - set(done))
    if missing:
        log.error("training ended without the checkpoints of steps %s in %s", missing, ckpt_dir)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
