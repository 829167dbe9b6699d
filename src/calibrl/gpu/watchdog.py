"""A training launch that stops making progress is ended, so that the job fails and its retry resumes.

A trainer's driver waits on its workers without a deadline: where a vLLM worker dies under it (a GPU out of memory,
a failed weight sync; seen on CPU with verl 0.9.1's replicas), the driver can wait until the job's SLURM time limit,
holding its GPUs for hours and costing the retry the rest of the limit. The watchdog polls a measure of progress
that grows with every finished step (a trainer's metrics file); when it has not changed for ``limit_s`` seconds, the
first step's startup included, it logs what it saw and ends the process with :data:`EXIT_CODE`, as a killed job ends:
``ray_cluster.sh`` stops Ray, the job fails and Snakemake's retry resumes from the last saved state.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("calibrl.gpu.watchdog")

EXIT_CODE = 75  # EX_TEMPFAIL: the job may succeed when run again


def file_size(path: str | Path) -> Callable[[], int]:
    """Progress as the size of ``path`` (0 while it does not exist): an unbuffered log that grows once a step."""
    path = Path(path)

    def size() -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    return size


def folder_size(path: str | Path) -> Callable[[], int]:
    """Progress as the bytes of the files below ``path`` (0 while it does not exist): a log folder whose writer
    flushes each step's records (TensorBoard's event files: within ``flush_secs``, 120 s)."""
    path = Path(path)

    def size() -> int:
        total = 0
        for p in path.rglob("*"):
            try:
                total += p.stat().st_size if p.is_file() else 0
            except FileNotFoundError:  # a file renamed or removed while walking
                continue
        return total

    return size


class Watchdog:
    """``with Watchdog(progress, limit_s, what):`` ends the process (``stall``; default: exit :data:`EXIT_CODE`) once
    ``progress()`` has not changed for ``limit_s`` seconds, polled every ``poll_s``; leaving the block stops it."""

    def __init__(self, progress: Callable[[], object], limit_s: float, what: str, poll_s: float | None = None,
                 stall: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):  # fmt: skip
        if limit_s <= 0:
            raise ValueError(f"the watchdog's limit must be positive, got {limit_s} s")
        self.progress, self.limit_s, self.what = progress, float(limit_s), what
        self.poll_s = poll_s if poll_s is not None else min(30.0, self.limit_s / 10)
        self.stall, self.clock = stall or _exit, clock
        self._stop = threading.Event()

    def __enter__(self) -> Watchdog:
        self._thread = threading.Thread(target=self._watch, name="calibrl-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        seen, since = self.progress(), self.clock()
        while not self._stop.wait(self.poll_s):
            now, value = self.clock(), self.progress()
            if value != seen:
                seen, since = value, now
            elif now - since > self.limit_s:
                self.stall(
                    f"{self.what}: no progress for {_span(now - since)} (limit {_span(self.limit_s)}): a worker "
                    "likely died under the trainer; ending the launch so that the job's retry resumes from the last "
                    "saved state"
                )
                return


def _span(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _exit(message: str) -> None:
    log.error(message)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(EXIT_CODE)  # the main thread is blocked in the trainer's wait: only the process's end frees it
