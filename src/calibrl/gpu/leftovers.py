"""A run's processes left behind on this host, found by the settings path their environment names (``CALIBRL_SETTINGS``,
``calibrl.checkpoints.SETTINGS_ENV``: every Ray worker of a run gets it through the run's runtime environment, and
so do the vLLM engine processes those workers start).

Why: ``ray.shutdown()`` ends a job's actors, but a vLLM engine core an actor started is its child process, and
where the actor dies uncleanly the engine is reparented and lives on, holding its GPU's memory (or, on a CPU
rehearsal, GBs of the host's). A SLURM with ``proctrack/cgroup`` ends it with the job; one that tracks processes by
pid, and a launch outside SLURM, do not. The launchers call :func:`kill` when their trainer returns or fails (after a
grace for Ray's own shutdown, :data:`GRACE_S`); the rehearsal tests call it for a whole work folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("calibrl.gpu.leftovers")

GRACE_S = 30.0  # a launcher waits this long after ray.shutdown() for its run's workers to end by themselves


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


def kill(settings: str | Path, *, under: bool = False, name: str = "", grace_s: float = 0.0) -> list[int]:
    """SIGKILL :func:`processes` (same arguments) still alive after ``grace_s`` seconds; the pids it killed. The grace
    is for what ends by itself: after ``ray.shutdown()`` Ray ends the job's workers within seconds, and only what
    outlives that is left behind."""
    import psutil

    procs = processes(settings, under=under, name=name)
    if procs and grace_s > 0:
        procs = psutil.wait_procs(procs, timeout=grace_s)[1]
    killed = []
    for proc in procs:
        try:
            what = f"{proc.pid} {proc.name()}"
            proc.kill()
            killed.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        log.warning("killed a process the run of %s left behind: %s", settings, what)
    return killed
