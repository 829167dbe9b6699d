"""The crash- and hang-safe pool that grades (response, gold) pairs with math-verify, with a cache.

Grading runs in worker processes because math-verify's timeouts are ``signal.alarm`` based: they only
work in a process's main thread, and they cannot interrupt C code (a huge integer power, say). A worker
that overruns the longest time math-verify could legitimately take on one item, or dies, is killed and
replaced, and the item is reported as timed out, so a job never hangs on a pathological response.

Workers are started with the ``forkserver`` method (``spawn`` where that is unavailable): a worker never
inherits the parent's torch threads or CUDA state. Like ``spawn``, ``forkserver`` re-imports the parent's
``__main__`` module in each worker, so a script that creates a :class:`Grader` at module level (a
Snakemake ``script:`` for example) must keep that code under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from calibrl.grading.verify import Grade, gold_check, grade_one, seconds, widen_math_verify_caches

logger = logging.getLogger(__name__)

__all__ = ["Grader", "gold_problems"]

# --------------------------------------------------------------------------------------------------
# Worker side of the pool
# --------------------------------------------------------------------------------------------------

_progress: Any = None  # the worker's end of the progress queue (set by _init_worker)


OWNER_POLL = 2.0  # seconds between a worker's checks that the process owning its pool is alive


def _init_worker(progress: Any, memory_limit_mb: int | None, owner: int | None = None) -> None:
    """Runs once in each worker: keep the queue, cap memory, import and warm up math-verify, and end with the owner.

    A worker blocks on its task queue, whose write end it holds itself, and its parent is the forkserver: when the
    process that owns the pool is killed (a Ray actor stopped with its cluster), nothing would end the worker, which
    stays idle forever where no cgroup ends the job's processes (a local SLURM, a login node)."""
    global _progress
    _progress = progress
    if owner is not None:
        threading.Thread(target=_exit_with, args=(owner,), daemon=True, name="grading-owner").start()
    if memory_limit_mb:
        try:
            import resource

            limit = memory_limit_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):  # not on this platform, or above the hard limit
            pass
    widen_math_verify_caches()
    grade_one("\\boxed{1}", "1", 5.0)


def _exit_with(owner: int) -> None:
    while True:
        time.sleep(OWNER_POLL)
        try:
            os.kill(owner, 0)
        except (ProcessLookupError, PermissionError):  # gone, or its pid is another user's process now
            os._exit(0)


def _send(msg: tuple) -> None:
    """Report progress; messages stay below PIPE_BUF so that a killed worker never leaves half of one."""
    if _progress is None:
        return
    if len(pickle.dumps(msg)) > 3000:
        msg = msg[:3] + (None,)
    _progress.put(msg)


def _grade_chunk(token: int, items: list[tuple[str, str]], timeout: float, check: Callable = None) -> list[Grade]:
    """Grade a chunk; announce each item's start (for hang detection) and result (to survive a kill)."""
    check = check or grade_one
    out = []
    for pos, (response, gold) in enumerate(items):
        _send(("start", token, pos, os.getpid()))
        grade = check(response, gold, timeout)
        _send(("done", token, pos, grade))
        out.append(grade)
    return out


def _warm_context() -> mp.context.BaseContext:
    """forkserver with math-verify preloaded (fast worker start), else spawn: never fork a torch parent."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["calibrl.grading", "math_verify"])
        return ctx
    return mp.get_context("spawn")


# --------------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------------


def _cache_key(response: str, gold: str) -> bytes:
    """Digest of the exact (response, gold) pair: math-verify reads the whole response, so nothing short of
    the whole text is known to give the same verdict. (Repeated final answers in different responses are
    cached in the workers, on what math-verify compares: see calibrl.grading.verify.)"""
    text = response + "\0" + gold
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class Grader:
    """Grades (response, gold) pairs in a process pool, with a cache and hang/crash recovery; each verdict is
    math-verify's (:func:`calibrl.grading.grade_one`), or that of a task-specific ``check``.

    ``workers=0`` grades in-process (for debugging: no protection against hangs in C code).
    ``stats`` counts items returned, cache hits, timed-out items (including killed or crashed workers) and
    other errored items. The cache keeps at most ``cache_size`` grades (oldest dropped first). A response
    over ``max_chars`` is cut to its last ``max_chars`` characters before a task ``check`` sees it;
    math-verify always reads the whole response, as it does outside the Grader.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 5.0,
        max_chars: int = 20000,
        *,
        chunk_size: int = 16,
        memory_limit_mb: int | None = 4096,
        grace: float = 1.0,
        cache_size: int = 1_000_000,
        check: Callable[[str, str, float], Grade] | None = None,
    ) -> None:
        if workers < 0 or timeout <= 0 or max_chars <= 0 or chunk_size <= 0:
            raise ValueError("workers >= 0, timeout > 0, max_chars > 0 and chunk_size > 0 are required")
        self.workers = workers
        # A task-specific checker (a module-level function, so workers can unpickle it) replaces
        # grade_one; its Grade.extracted (e.g. a canonical answer) is then kept as it returns it.
        self.check = check
        self.timeout = float(timeout)
        self.max_chars = max_chars
        self.chunk_size = chunk_size
        self.memory_limit_mb = memory_limit_mb
        # A worker is declared hung when one item has run longer than math-verify can legitimately take on
        # it: six calls (two parses, at most 2 x 2 comparisons), each stopped at its whole-second timeout,
        # plus this much slack. Only an item stuck where no alarm reaches (C code) gets there.
        self.hang_after = 6 * seconds(self.timeout) + grace
        self.stats: dict[str, int] = {"items": 0, "cache_hits": 0, "timeouts": 0, "errors": 0}
        self.cache_size = cache_size
        self._cache: dict[bytes, Grade] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._queue: Any = None
        self._tokens = itertools.count()
        self._startup_failures = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # e.g. KeyboardInterrupt mid-grade: a worker may still be busy
            self._kill_pool()
        self.close()

    def close(self) -> None:
        """Shut the worker pool down (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._close_queue()

    def _close_queue(self) -> None:
        if self._queue is not None:
            try:
                self._queue.close()
            except Exception:
                pass
            self._queue = None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = _warm_context()
            self._queue = ctx.SimpleQueue()
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=ctx,
                initializer=_init_worker,
                initargs=(self._queue, self.memory_limit_mb, os.getpid()),
            )
        return self._pool

    def _kill_pool(self) -> None:
        """Kill our workers (a hung one cannot be cancelled) and forget the pool and its queue."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            try:
                p.kill()
            except Exception:
                pass
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)
        self._close_queue()

    # -- grading ---------------------------------------------------------------------------------

    def grade(self, pairs: Sequence[tuple[str, str]]) -> list[Grade]:
        """Grade (response, gold) pairs; the result is aligned with ``pairs``. Never hangs."""
        keys: list[bytes] = []
        known: dict[bytes, Grade] = {}  # grades this call reuses (the cache may evict meanwhile)
        todo: dict[bytes, tuple[str, str]] = {}
        for response, gold in pairs:
            response, gold = str(response), str(gold)
            if self.check is not None and len(response) > self.max_chars:
                response = response[-self.max_chars :]  # a task's final answer is at the end
            key = _cache_key(response, gold)
            keys.append(key)
            if key in known or key in todo:
                self.stats["cache_hits"] += 1
            elif (hit := self._cache.get(key)) is not None:
                known[key] = hit
                self.stats["cache_hits"] += 1
            else:
                todo[key] = (response, gold)

        if todo:
            for key, grade in zip(todo, self._grade_jobs(list(todo.values()))):
                known[key] = self._cache[key] = grade
        while len(self._cache) > self.cache_size:  # drop the oldest entries
            del self._cache[next(iter(self._cache))]

        out = [known[key] for key in keys]
        for grade in out:
            self.stats["items"] += 1
            if grade.timed_out:
                self.stats["timeouts"] += 1
            elif grade.error is not None:
                self.stats["errors"] += 1
        return out

    def _grade_jobs(self, jobs: list[tuple[str, str]]) -> list[Grade]:
        if self.workers == 0:
            return [(self.check or grade_one)(r, g, self.timeout) for r, g in jobs]
        results, suspects = self._run_pool(jobs, self.chunk_size)
        # Items in flight when a worker died: re-grade each alone, so that a second death is its own.
        for i in suspects:
            alone, _ = self._run_pool([jobs[i]], 1)
            results[i] = alone.get(0) or Grade(
                False, None, timed_out=True, error="worker process died (BrokenProcessPool)"
            )
        return [results[i] for i in range(len(jobs))]

    def _submit(self, chunks: dict[int, list[int]], jobs: list[tuple[str, str]]) -> dict[Any, int]:
        """Submit every chunk; a pool found broken (a worker died while idle) is replaced once."""
        for attempt in range(2):
            pool = self._ensure_pool()
            try:
                return {
                    pool.submit(_grade_chunk, token, [jobs[i] for i in idxs], self.timeout, self.check): token
                    for token, idxs in chunks.items()
                }
            except Exception:  # BrokenProcessPool / RuntimeError from a dead pool
                self._kill_pool()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _run_pool(self, jobs: list[tuple[str, str]], chunk_size: int) -> tuple[dict[int, Grade], list[int]]:
        """Grade ``jobs`` in the pool until each has a result or is a crash suspect.

        Returns results by job index, and the indices of items that were running when a worker died.
        """
        results: dict[int, Grade] = {}
        suspects: list[int] = []
        todo = list(range(len(jobs)))
        # No message at all for this long means workers cannot even start (or hang while starting).
        stall_after = 2 * self.hang_after + 60.0
        while todo:
            chunks = {next(self._tokens): todo[s : s + chunk_size] for s in range(0, len(todo), chunk_size)}
            inflight = self._submit(chunks, jobs)
            todo = []
            running: dict[int, tuple[int, float]] = {}  # token -> (position of current item, its start)
            seen_start = False
            failure = None
            hung: set[int] = set()
            last_progress = time.monotonic()
            while inflight and failure is None:
                done, _ = wait(inflight, timeout=0.1, return_when=FIRST_COMPLETED)
                now = time.monotonic()
                if self._drain(chunks, running, results):
                    seen_start = True
                    last_progress = now
                for fut in done:
                    try:
                        grades = fut.result()
                    except Exception:  # BrokenProcessPool, or anything else the pool throws
                        failure = "crash"
                        continue
                    last_progress = now
                    token = inflight.pop(fut)
                    for i, g in zip(chunks[token], grades):
                        results[i] = g
                    running.pop(token, None)
                live = set(inflight.values())
                hung = {t for t, (_, t0) in running.items() if t in live and now - t0 > self.hang_after}
                if failure is None and hung:
                    failure = "hang"
                elif failure is None and now - last_progress > stall_after:
                    failure = "stall"
            if failure is None:
                continue
            self._kill_pool()
            if failure != "hang" and not seen_start:
                self._startup_failures += 1
                if self._startup_failures >= 2:
                    raise RuntimeError(
                        "calibrl.grading: worker processes fail to start. If a script creates the Grader "
                        "at module level, move that code under `if __name__ == '__main__':` (workers "
                        "re-import the main module)."
                    )
            logger.warning("grading pool %s; killed and restarted it", failure)
            for token in set(inflight.values()):
                cur = running.get(token, (-1, 0.0))[0]
                for pos, i in enumerate(chunks[token]):
                    if i in results:
                        continue
                    if pos == cur and token in hung:
                        results[i] = Grade(
                            False, None, timed_out=True, error=f"worker hung > {self.hang_after:g}s; killed"
                        )
                    elif pos == cur and failure == "crash":
                        suspects.append(i)
                    else:
                        todo.append(i)
        return results, suspects

    def _drain(self, chunks: dict[int, list[int]], running: dict, results: dict[int, Grade]) -> bool:
        """Read progress messages (any left from older rounds are ignored); True if an item started."""
        seen = False
        q = self._queue
        while q is not None and not q.empty():
            kind, token, pos, payload = q.get()
            if token not in chunks:
                continue
            if kind == "start":
                seen = True
                self._startup_failures = 0
                running[token] = (pos, time.monotonic())
            elif kind == "done":
                running.pop(token, None)  # between items nothing can hang
                if payload is not None:
                    results[chunks[token][pos]] = payload
        return seen


def gold_problems(golds: Sequence[str], workers: int = 2, timeout: float = 5.0) -> dict[int, str]:
    """Index -> what is wrong, for each gold answer math-verify cannot parse (no response could ever be graded
    against it). Checked in :class:`Grader` worker processes, so a pathological gold cannot hang the caller."""
    if not golds:
        return {}
    with Grader(workers=workers, timeout=timeout, check=gold_check) as grader:
        grades = grader.grade([("", str(g)) for g in golds])
    out = {}
    for i, (gold, grade) in enumerate(zip(golds, grades)):
        if not grade.correct:
            why = "timed out" if grade.timed_out else grade.error
            detail = f" ({why})" if why and why != "gold answer did not parse" else ""
            out[i] = f"gold answer {str(gold)!r:.80} does not parse with math-verify{detail}"
    return out
