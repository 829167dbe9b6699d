"""Logging set-up shared by every job, and a progress reporter with rate and ETA."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path


def setup(logfile: str | Path | None = None, level: int = logging.INFO) -> None:
    """Log to stderr and, when given, to ``logfile`` (a rule's ``log:``), replacing earlier handlers; an exception
    that ends the job is logged there too (:func:`failed`), so the job's log holds its own failure."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile:
        Path(logfile).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(logfile, mode="w", encoding="utf-8"))
    logging.basicConfig(
        level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", handlers=handlers, force=True
    )
    previous = sys.excepthook  # Ctrl-C keeps its own short message
    sys.excepthook = lambda kind, exc, tb: (
        previous(kind, exc, tb) if isinstance(exc, KeyboardInterrupt) else failed(exc)
    )


# Failures whose cause and fix one line can name: (exception class names, why, fix; "" where the message says
# it); the message names the file.
KNOWN = (
    (("CheckpointUnreadable",), "a saved model cannot be read", ""),
    (("FileNotFoundError",), "a file the job reads is missing",
     "rerun the rule that writes it (snakemake --forcerun RULE), or restore it"),
    (("OutOfMemoryError", "MemoryError"), "out of memory",
     "give the job more memory (its rule's mem_mb in the profile) or fewer grading workers (grid.workers)"),
    (("OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectionError"), "the download could not reach the Hub",
     "run the download rules where the Hub is reachable (the login node), or pre-seed the files"),
)  # fmt: skip


def explain(exc: BaseException) -> str | None:
    """One line naming a known failure's kind and its fix, or None."""
    names = {k.__name__ for k in type(exc).__mro__}
    for kinds, why, fix in KNOWN:
        if names & set(kinds):
            return f"{why}: {exc}" + (f". Fix: {fix}" if fix else "")
    return None


def failed(exc: BaseException) -> None:
    """Log the exception that ends a job, with its traceback and, for a known kind, the cause and the fix."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)) or getattr(exc, "__calibrl_logged__", False):
        return
    log = logging.getLogger("calibrl.job")
    log.error("the job failed: %s", explain(exc) or f"{type(exc).__name__}: {exc}", exc_info=exc)
    for handler in logging.getLogger().handlers:
        handler.flush()
    try:
        exc.__calibrl_logged__ = True
    except AttributeError:
        pass


class Progress:
    """Logs ``done/total``, the rate and the ETA at most every ``every`` seconds (and at the end). ``done``: what
    was done before this process (a resumed run): counted in ``done/total``, not in the rate."""

    def __init__(self, what: str, total: int, logger: logging.Logger, every: float = 5.0, done: int = 0):
        self.what, self.total, self.log, self.every = what, total, logger, every
        self.start = self.last = time.monotonic()
        self.done = self.before = done

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last < self.every and self.done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        rate = (self.done - self.before) / elapsed if elapsed > 0 else float("inf")
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
