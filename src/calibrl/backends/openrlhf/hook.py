"""The Ray ``worker_process_setup_hook`` of a run: it installs the patches the run's settings call for.

The launcher starts Ray with :func:`setup` as every worker's setup hook and ``CALIBRL_SETTINGS``
(``calibrl.checkpoints.SETTINGS_ENV``), the path of the run's ``settings.json``, which :func:`setup` reads once
(``calibrl.checkpoints.RunStamp``; the launcher also passes the grading pool's size and timeout, and on a rehearsal
its faults, as variables: ``launch.runtime_env``). :func:`patches` returns what to install:
- always: the step limit (``steps``), DeepSpeed's optimizer kernel from torch (``fused_adam``) and torch's build lock
  for JIT extensions freed from a killed holder (``calibrl.gpu.extension_lock``);
- from ``grid.train``: weight decay on every parameter for ``weight_decay_scope: all`` (``decay_scope``);
- from the layout: DeepSpeed's state at ``ds_save_steps`` and the Hugging Face copies at ``eval_every`` alone
  (``save_cadence``);
- from the compiled method: IAC when alpha > 0 (``iac``), Dr. GRPO's constant normaliser for ``loss_agg:
  seq-mean-token-sum-norm`` (``loss_norm``), DLC when mu > 0 (``dlc``);
- on a CPU rehearsal (a layout key): the CUDA stand-ins (``cpu_standins``), and its faults where the variable asks.
A patch that must also act in the driver (DLC's record of the shared placement group; the stand-ins) has a driver
side, which the launcher installs in its own process (:func:`install_driver`); the launcher also patches the final
save in the driver itself (``launch.skip_final_save``). The launcher checks every target of the run's patches against
the installed packages before Ray starts (:func:`check`): that each exists, and where a wrapper relies on them, the
text it calls and its parameters (``patching.Target``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from calibrl.backends.openrlhf import (
    cpu_standins,
    decay_scope,
    dlc,
    fused_adam,
    iac,
    loss_norm,
    rehearsal_faults,
    save_cadence,
    steps,
)
from calibrl.checkpoints import RunStamp
from calibrl.gpu import extension_lock
from calibrl.gpu.patching import Target

log = logging.getLogger("calibrl.openrlhf.hook")

SETUP_HOOK = f"{__name__}.setup"


@dataclass(frozen=True)
class Patch:
    """``install`` runs in every Ray worker (the setup hook); ``driver``, where the patch must also act in the
    driver process, runs there (``launch.main``): Ray never runs the setup hook in the driver, and OpenRLHF builds
    its actor groups there (``cli/train_ppo_ray.py``) and pickles them into the trainer actor."""

    name: str
    targets: tuple[Target, ...]
    install: Callable[[], None]
    driver: Callable[[], None] | None = None


def patches(stamp: RunStamp) -> list[Patch]:
    """The patches the run of ``stamp`` (its settings.json, read from the run's folder) needs, from its compiled
    method (``calibrl.spec.MethodSpec``)."""
    spec, train, run_dir = stamp.method, stamp.train, stamp.run_dir
    out = [
        Patch("step limit", steps.TARGETS, functools.partial(steps.install, run_dir)),
        Patch("FusedAdam on torch's kernels", fused_adam.TARGETS, fused_adam.install),  # no nvcc on the nodes
        Patch("extension build locks a killed job left", extension_lock.TARGETS, extension_lock.install),
    ]
    saves = stamp.resources.get("ds_save_steps")  # unset: both saved at eval_every, OpenRLHF's own
    if saves and saves != train["eval_every"]:
        install = functools.partial(save_cadence.install, train["eval_every"])
        out.append(Patch(f"DeepSpeed's state every {saves} steps", save_cadence.TARGETS, install))
    if train["weight_decay_scope"] == "all":  # no_bias_norm is OpenRLHF's own
        out.append(Patch("weight decay on every parameter", decay_scope.TARGETS, decay_scope.install))
    if spec.uses_iac:
        install = functools.partial(iac.install, spec.iac_alpha)
        out.append(Patch(f"IAC (alpha {spec.iac_alpha:g})", iac.TARGETS, install))
    if spec.loss_agg == "seq-mean-token-sum-norm":
        length = int(train["max_new_tokens"])
        out.append(Patch("Dr. GRPO's normaliser", loss_norm.TARGETS, functools.partial(loss_norm.install, length)))
    if spec.uses_dlc:
        memory = stamp.paths["memory"]
        decay = (train["weight_decay"], train["weight_decay_scope"])
        install = functools.partial(dlc.install, memory, spec.dlc_mu, spec.memory_lr, decay, stamp.resources)
        out.append(Patch(f"DLC (mu {spec.dlc_mu:g})", dlc.TARGETS, install, dlc.install_driver))
    if cpu_standins.enabled(stamp):
        targets = tuple(s.target for s in cpu_standins.STANDINS)
        out.append(Patch("CPU rehearsal's CUDA stand-ins", targets, cpu_standins.install_worker,
                         cpu_standins.install_driver))  # fmt: skip
        if os.environ.get(rehearsal_faults.ENV):
            install = functools.partial(rehearsal_faults.install, run_dir, stamp.run)
            out.append(Patch("rehearsal faults", rehearsal_faults.TARGETS, install))
    return out


def check(stamp: RunStamp) -> list[str]:
    """Find every target of the run's patches in the installed OpenRLHF (raises ``PatchTargetMissing`` naming the
    first one missing); returns the patches' names."""
    found = patches(stamp)
    for patch in found:
        for target in patch.targets:
            target.check()
    return [p.name for p in found]


def install_driver(stamp: RunStamp) -> list[str]:
    """Install in this (the driver's) process the driver side of the run's patches; returns their names."""
    done = []
    for patch in patches(stamp):
        if patch.driver is not None:
            patch.driver()
            done.append(patch.name)
    return done


def setup() -> None:
    """The ``worker_process_setup_hook``: install the run's patches in this process (each applied when, and if,
    this process imports its module). A process without ``CALIBRL_SETTINGS`` is left alone."""
    stamp = RunStamp.from_env()
    if stamp is None:
        return
    _log_to_stderr()
    for patch in patches(stamp):
        patch.install()


def _log_to_stderr() -> None:
    """The patches' INFO lines (a resumed DLC memory, the step limit, the divergence check) on this worker's stderr,
    which Ray forwards to the job's log; Python's default shows warnings only."""
    logger = logging.getLogger("calibrl")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
