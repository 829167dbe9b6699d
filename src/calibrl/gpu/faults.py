"""Faults a CPU rehearsal injects into a training job, at a named point, once: what a preemption or a node failure
does to a job, made deterministic so a test can rerun the job and check that it resumes. Shared by the GPU backends,
each of which fires them at its own points (OpenRLHF's ``rehearsal_faults``, verl's ``trainer``).

``CALIBRL_REHEARSAL_FAULTS`` lists ``<run>:<kind>:<step>`` entries (comma-separated; ``<run>`` as
``calibrl.runs.Run.path``, e.g. ``tiny-policy/grpo/s0``). Kinds (:data:`KINDS`):

* ``mid_step``: inside global step ``<step>``, after its rollout and before its policy update;
* ``before_hf``: after the trainer saved its resume state of step ``<step>`` and before the Hugging Face copy that
  evaluation reads is in place;
* ``dead_engine``: inside global step ``<step>``, before its policy update, every vLLM engine process of the run is
  killed and the job goes on (:func:`kill_engines`), as a GPU's out-of-memory kills one: the trainer must fail (verl
  0.9.1 raises vLLM's ``EngineDeadError`` at its next call) so that the retry resumes;
* ``hang``: inside global step ``<step>``, before its policy update, the trainer blocks for good (:func:`hang`), as a
  driver does that waits on a worker that never answers: the case of ``calibrl.gpu.watchdog``, which ends the launch.

:func:`fire` kills the job's driver (the backend's launcher, ``CALIBRL_DRIVER_PID``; SIGKILL): ``ray_cluster.sh``
then stops Ray and the job fails, as a killed job does, and SLURM and Snakemake's retry run the same command again.
Each fault fires once: a marker in ``<run>/rehearsal_faults/`` records that it has. Backends inject them only into a
rehearsal's runs and refuse the variable anywhere else.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger("calibrl.gpu.faults")

ENV = "CALIBRL_REHEARSAL_FAULTS"
DRIVER_ENV = "CALIBRL_DRIVER_PID"
KINDS = ("mid_step", "before_hf", "dead_engine", "hang")
ENGINE = "VLLM::EngineCore"  # the process title of vLLM's engine core (v1), one process per engine


def parse(value: str, run: str) -> dict[str, int]:
    """``kind -> step`` of the faults ``value`` names for ``run``; a malformed entry raises naming it."""
    out = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        path, _, rest = entry.rpartition(":")
        where, _, kind = path.rpartition(":")
        if kind not in KINDS or not rest.isdigit() or not where:
            raise ValueError(f"{ENV}: {entry!r} is not <run>:<{'|'.join(KINDS)}>:<step>")
        if where == run:
            out[kind] = int(rest)
    return out


def _once(marks: str | Path, name: str) -> bool:
    """Whether fault ``name`` fires now: not if its marker in ``marks`` says it has; else the marker is written."""
    mark = Path(marks) / name
    if mark.exists():
        return False
    mark.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(f"{time.time()}\n")
    return True


def kill_engines(marks: str | Path, name: str) -> int:
    """Kill (SIGKILL) the vLLM engine processes of this run (those whose environment names its settings.json, as
    every process of the run's Ray workers does) unless fault ``name`` has fired before; how many. None found is an
    error: the fault would test nothing."""
    from calibrl.checkpoints import SETTINGS_ENV
    from calibrl.gpu import leftovers

    if not _once(marks, name):
        return 0
    ours = os.environ[SETTINGS_ENV]
    killed = leftovers.kill(ours, name=ENGINE)
    if not killed:
        raise RuntimeError(f"rehearsal fault {name}: no {ENGINE} process of this run ({SETTINGS_ENV}={ours})")
    log.warning("rehearsal fault %s: killed the run's vLLM engine processes %s", name, killed)
    return len(killed)


def hang(marks: str | Path, name: str) -> None:
    """Block for good unless fault ``name`` has fired before: the trainer waits, as on a worker that never answers,
    until something outside ends the job (the launcher's watchdog, the job's time limit)."""
    if not _once(marks, name):
        return
    log.warning("rehearsal fault %s: the trainer blocks", name)
    while True:
        time.sleep(3600)


def fire(marks: str | Path, name: str) -> None:
    """Kill the job's driver unless fault ``name`` has fired before (its marker in ``marks``); then wait to go with
    the job's Ray cluster."""
    if not _once(marks, name):
        return
    pid = int(os.environ[DRIVER_ENV])
    log.warning("rehearsal fault %s: killing the job's driver (pid %d)", name, pid)  # may not reach the log: the
    os.kill(pid, signal.SIGKILL)  # driver forwards it; the marker is the record
    time.sleep(3600)
