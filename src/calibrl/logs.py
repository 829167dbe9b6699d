"""Logging set-up shared by every job, and a progress reporter with rate and ETA."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path


def setup(logfile: str | Path | None = None, level: int = logging.INFO) -> None:
    """Log to stderr and, when given, to ``logfile`` (a rule's ``log:``), replacing earlier handlers."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile:
        Path(logfile).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(logfile, mode="w", encoding="utf-8"))
    logging.basicConfig(
        level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", handlers=handlers, force=True
    )


class Progress:
    """Logs ``done/total``, the rate and the ETA at most every ``every`` seconds (and at the end)."""

    def __init__(self, what: str, total: int, logger: logging.Logger, every: float = 5.0):
        self.what, self.total, self.log, self.every = what, total, logger, every
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last < self.every and self.done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else float("inf")
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        self.log.info(
            "%s %d/%d (%.2f/s, elapsed %.0fs, ETA %.0fs) %s",
            self.what,
            self.done,
            self.total,
            rate,
            elapsed,
            eta,
            note,
        )
