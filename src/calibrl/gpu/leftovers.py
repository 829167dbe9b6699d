"""A run's processes left behind on this host, found by the settings path their environment names (``CALIBRL_SETTINGS``,
``calibrl.checkpoints.SETTINGS_ENV``: every Ray worker of a run gets it through the run's runtime environment, and
so do the vLLM engine processes those workers start).

Why: ``ray.shutdown()`` ends a job's actors, but a vLLM engine core an actor started is its child process, and
where the actor dies uncleanly the engine is reparented and lives on, holding its GPU's memory (or, on a CPU
rehearsal, GBs of the host's). A SLURM with ``proctrack/cgroup`` ends it with the job; one that tracks processes by
pid, and a launch outside SLURM, do not. The launchers call :func:`kill` when their trainer returns or fails; the
rehearsal tests call it for a whole work folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("calibrl.gpu.leftovers")


def processes(settings: str | Path, *, under: bool = False, name: str = ""):
    """The live processes (psutil) whose ``CALIBRL_SETTINGS`` is ``settings`` (or, with ``under``, any path inside
    the folder ``settings``) and whose command line contains ``name``; never this process or its ancestors."""
    import psutil

    from calibrl.checkpoints import SETTINGS_ENV

    ours = str(Path(settings).resolve())
    spared = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.pid in spared or name not in " ".join(proc.info["cmdline"] or [proc.info["name"] or ""]):
                continue
            value = proc.environ().get(SETTINGS_ENV, "")
            if value.startswith(ours + "/") if under else value == ours:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill(settings: str | Path, *, under: bool = False, name: str = "") -> list[int]:
    """SIGKILL :func:`processes` (same arguments); the pids it killed."""
    import psutil

    killed = []
    for proc in processes(settings, under=under, name=name):
        try:
            proc.kill()
            killed.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    if killed:
        log.warning("killed %d process(es) left behind by the run of %s: %s", len(killed), settings, killed)
    return killed
