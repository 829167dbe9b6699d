"""Grade math-benchmark responses with math-verify, safely, and compute AVG@k / PASS@k.

Grading runs in worker processes because math-verify's timeouts are ``signal.alarm`` based: they only
work in a process's main thread, and they cannot interrupt C code (a huge integer power, say). A worker
that overruns its deadline or dies is killed and replaced, and the item is reported as timed out, so a
job never hangs on a pathological response.

Workers are started with the ``forkserver`` method (``spawn`` where that is unavailable): a worker never
inherits the parent's torch threads or CUDA state. Like ``spawn``, ``forkserver`` re-imports the parent's
``__main__`` module in each worker, so a script that creates a :class:`Grader` at module level (a
Snakemake ``script:`` for example) must keep that code under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import multiprocessing as mp
import os
import pickle
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "Grade",
    "Grader",
    "avg_at_k",
    "extract_answer",
    "gold_check",
    "gold_problems",
    "grade_one",
    "pass_at_k",
    "summarize",
]

_ERROR_CHARS = 300  # error messages are truncated: math-verify puts the whole input into some of them


@dataclass(frozen=True)
class Grade:
    """Outcome of grading one response. ``timed_out``/``error`` only matter when ``correct`` is False."""

    correct: bool
    extracted: str | None
    timed_out: bool = False
    error: str | None = None


# --------------------------------------------------------------------------------------------------
# Answer extraction (pure string code, linear time)
# --------------------------------------------------------------------------------------------------

# One token per box opener, escaped brace/backslash (not a group delimiter) or bare brace.
_BRACE_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|\\[\\{}]|[{}]")
_ANSWER_CUE = re.compile(r"answer\s*is|answer\s*:", re.IGNORECASE)


def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{}``/``\\fbox{}``: one pass with a brace stack, O(n).

    "Last" is the box that closes last, so for nested boxes the outer one wins; an unclosed box is
    skipped in favour of an earlier complete one.
    """
    first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first < 0:
        return None
    # Braces before the first opener leave only plain-brace entries on the stack, which never choose a box,
    # so the scan can start there: at the start of its run of backslashes, where tokens start in a full
    # scan too (an even run makes "\\boxed" a line break, not a box). A reasoning trace of thousands of
    # characters with the box at the end then costs a few tokens, not one per brace.
    while first > 0 and text[first - 1] == "\\":
        first -= 1
    stack: list[int] = []  # content start for box openers, -1 for plain braces
    best: tuple[int, int] | None = None
    for m in _BRACE_TOKENS.finditer(text, first):
        tok = m.group()
        if tok[-1] == "{" and tok[0] == "\\" and len(tok) > 2:  # \boxed{ or \fbox{
            stack.append(m.end())
        elif tok == "{":
            stack.append(-1)
        elif tok == "}" and stack:
            start = stack.pop()
            if start >= 0:
                best = (start, m.start())
    if best is None:
        return None
    return text[best[0] : best[1]].strip()


def _after_answer_cue(text: str) -> str | None:
    """Rest of the line after the last "answer is" / "answer:", lightly cleaned."""
    last = None
    for last in _ANSWER_CUE.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    end = text.find("\n", last.end())
    rest = text[last.end() : end if end >= 0 else len(text)]
    rest = rest.strip().lstrip(":*").strip().rstrip("*").strip().rstrip(".").strip()
    return rest or None


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: last ``\\boxed{}``/``\\fbox{}`` content, else the rest of the line
    after the last "answer is"/"Answer:", else None. Linear time; never evaluates anything."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    return _after_answer_cue(text)


# --------------------------------------------------------------------------------------------------
# Single-item grading with math-verify
# --------------------------------------------------------------------------------------------------


def _is_delimited(s: str) -> bool:
    """True if ``s`` already carries LaTeX math delimiters, so it must not be wrapped in ``$...$``."""
    s = s.strip()
    return s.startswith(("$", "\\(", "\\[")) or "\\boxed" in s


def _gold_text(gold: str) -> str:
    return gold if _is_delimited(gold) else f"${gold.strip()}$"


def _pred_texts(extracted: str) -> list[str]:
    """Strings to parse for an extracted answer, best first (``$x$`` lets LaTeX parse, raw is fallback)."""
    if _is_delimited(extracted):
        return [extracted]
    return [f"${extracted}$", extracted]


def _seconds(timeout: float) -> int:
    """math-verify feeds its timeouts to ``signal.alarm``, which takes whole seconds (0 disables it)."""
    return max(1, math.ceil(timeout))


def _error_text(exc: BaseException) -> str:
    try:
        msg = f"{type(exc).__name__}: {exc}"
    except Exception:  # a str() that fails is possible with sympy objects
        msg = type(exc).__name__
    return msg[:_ERROR_CHARS]


def _parse(text: str, secs: int | None) -> list[Any]:
    import math_verify

    return math_verify.parse(text, parsing_timeout=secs, raise_on_error=True)


@lru_cache(maxsize=8192)
def _parse_cached(text: str, secs: int | None) -> tuple[Any, ...]:
    """Parses cached per process: a gold answer repeats for every sample of its problem, and the same
    final answer ("2", "\\frac{1}{2}") for many problems; a correct answer written as the gold is reuses
    the gold's parse. (Timeouts and errors raise, so they are never cached.)"""
    return tuple(_parse(text, secs))


def _parse_gold(gold: str, secs: int | None) -> tuple[Any, ...]:
    return _parse_cached(_gold_text(gold), secs)


_INTEGER = re.compile(r"-?[0-9]{1,100}")


def _integer_grade(extracted: str | None, gold: str) -> Grade | None:
    """The grade without sympy when the extracted answer and the gold are both plain integers (GSM8K, AIME
    and most of MATH): math-verify's verdict on two integers is their equality (leading zeros and -0
    included; tests/test_grading.py checks it against math-verify), so the parse and the verify that cost
    milliseconds are skipped. None for anything else."""
    if extracted is None:
        return None
    pred, gold = extracted.strip(), gold.strip()
    if _INTEGER.fullmatch(pred) and _INTEGER.fullmatch(gold):
        return Grade(int(pred) == int(gold), extracted)
    return None


class _OverBudget(Exception):
    """The per-item time budget (3 x timeout) would be exceeded by the next math-verify call."""


def gold_check(response: str, gold: str, timeout: float = 5.0) -> Grade:
    """A :class:`Grader` ``check`` that tests the gold answer alone (``response`` is ignored): ``correct``
    when math-verify parses it to something, as :func:`grade_one` requires before it can grade anything."""
    from math_verify.errors import TimeoutException

    try:
        secs = _seconds(timeout) if threading.current_thread() is threading.main_thread() else None
        if _parse_gold(str(gold), secs):
            return Grade(True, None)
        return Grade(False, None, error="gold answer did not parse")
    except TimeoutException:
        return Grade(False, None, timed_out=True)
    except Exception as exc:
        return Grade(False, None, error=_error_text(exc))


def grade_one(response: str, gold: str, timeout: float = 5.0) -> Grade:
    """Grade ``response`` against ``gold`` with math_verify.parse/verify; never raises.

    Each math-verify call gets ``timeout`` (rounded up to whole seconds); no call is started once the
    total could exceed 3 x ``timeout``. Signal timeouts need the main thread: elsewhere they are off.
    """
    from math_verify.errors import TimeoutException

    extracted: str | None = None
    try:
        if not isinstance(response, str) or not isinstance(gold, str):
            raise TypeError("response and gold must be str")
        extracted = extract_answer(response)
        if (fast := _integer_grade(extracted, gold)) is not None:
            return fast
        secs: int | None = _seconds(timeout)
        if threading.current_thread() is not threading.main_thread():
            secs = None
        t0 = time.monotonic()
        budget = 3 * timeout

        def check() -> None:
            if secs is not None and time.monotonic() - t0 + secs > budget + 1e-6:
                raise _OverBudget

        gold_parsed = _parse_gold(gold, secs)
        if not gold_parsed:
            return Grade(False, extracted, error="gold answer did not parse")
        pred_parsed: list[Any] = []
        for text in _pred_texts(extracted) if extracted is not None else [response]:
            check()
            pred_parsed = list(_parse_cached(text, secs))
            if pred_parsed:
                break
        verdict, error = _verify(gold_parsed, pred_parsed, secs, check)
        if verdict:
            return Grade(True, extracted)
        return Grade(False, extracted, timed_out=verdict is None, error=error)
    except (TimeoutException, _OverBudget):
        return Grade(False, extracted, timed_out=True)
    except Exception as exc:  # grading must never take the caller down
        return Grade(False, extracted, error=_error_text(exc))


def _verify(
    gold: Sequence[Any], pred: Sequence[Any], secs: int | None, check: Callable[[], None]
) -> tuple[bool | None, str | None]:
    """Verify each (gold, pred) pair as math_verify.verify does, but one call per pair so that a timeout
    or error in one pair is seen. Returns (verdict, first error): verdict is True if any pair matches,
    None if none does and some pair timed out, else False."""
    import math_verify
    from math_verify.errors import TimeoutException

    timed_out = False
    error = None
    for g in gold:
        for p in pred:
            try:
                check()
                if math_verify.verify(g, p, timeout_seconds=secs, raise_on_error=True):
                    return True, None
            except (TimeoutException, _OverBudget):
                timed_out = True
            except Exception as exc:
                error = error or _error_text(exc)
    return (None if timed_out else False), error


# --------------------------------------------------------------------------------------------------
# Worker side of the pool
# --------------------------------------------------------------------------------------------------

_progress: Any = None  # the worker's end of the progress queue (set by _init_worker)


def _init_worker(progress: Any, memory_limit_mb: int | None) -> None:
    """Runs once in each worker: keep the queue, cap memory, import and warm up math-verify."""
    global _progress
    _progress = progress
    if memory_limit_mb:
        try:
            import resource

            limit = memory_limit_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):  # not on this platform, or above the hard limit
            pass
    grade_one("\\boxed{1}", "1", 5.0)


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


def _compact(response: str, extracted: str | None) -> str:
    """What a worker needs to grade ``response``: ``\\boxed{extracted}`` when that extracts to the same answer
    (grade_one then reads nothing else), so a long reasoning trace is neither pickled nor scanned again."""
    if extracted is None:
        return response
    compact = f"\\boxed{{{extracted}}}"
    return compact if len(compact) < len(response) and extract_answer(compact) == extracted else response


def _cache_key(response: str, extracted: str | None, gold: str) -> bytes:
    """Digest of the (normalised extracted answer, gold) pair, or of the whole response if there is no
    extracted answer (grade_one then parses the response). Whitespace runs count as one space."""
    pred = "x" + " ".join(extracted.split()) if extracted is not None else "r" + response
    text = pred + "\0" + " ".join(gold.split())
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class Grader:
    """Grades (response, gold) pairs in a process pool, with a cache and hang/crash recovery.

    ``workers=0`` grades in-process (for debugging: no protection against hangs in C code).
    ``stats`` counts items returned, cache hits, pairs of two integers graded without sympy, timed-out
    items (including killed or crashed workers) and other errored items. The cache keeps at most
    ``cache_size`` grades (oldest dropped first). A response over ``max_chars`` is cut to its last
    ``max_chars`` characters before a task ``check`` sees it, and before math-verify searches it for an
    answer when it has no box or "answer is" (the answer itself is extracted from the whole response).
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
        # A worker is declared hung when one item has run for 3 x timeout plus this much slack.
        self.hang_after = 3 * self.timeout + grace
        self.stats: dict[str, int] = {"items": 0, "cache_hits": 0, "integer_pairs": 0, "timeouts": 0, "errors": 0}
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
                initargs=(self._queue, self.memory_limit_mb),
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
        extracted: list[str | None] = []
        known: dict[bytes, Grade] = {}  # grades this call reuses (the cache may evict meanwhile)
        todo: dict[bytes, tuple[str, str]] = {}
        for response, gold in pairs:
            response, gold = str(response), str(gold)
            if self.check is not None and len(response) > self.max_chars:
                response = response[-self.max_chars :]  # the final answer is at the end
            ans = extract_answer(response)  # linear time, so from the whole response: an early box counts
            if ans is None and len(response) > self.max_chars:
                # math-verify will search all of it: bound that work to the end, where a final answer is
                response = response[-self.max_chars :]
                ans = extract_answer(response)  # what the worker's grade_one will see
            key = _cache_key(response, ans, gold)
            keys.append(key)
            extracted.append(ans)
            if key in known or key in todo:
                self.stats["cache_hits"] += 1
            elif (hit := self._cache.get(key)) is not None:
                known[key] = hit
                self.stats["cache_hits"] += 1
            elif self.check is None and (fast := _integer_grade(ans, gold)) is not None:
                known[key] = self._cache[key] = fast  # no worker round trip for two integers
                self.stats["integer_pairs"] += 1
            else:
                todo[key] = (response if self.check is not None else _compact(response, ans), gold)

        if todo:
            for key, grade in zip(todo, self._grade_jobs(list(todo.values()))):
                if self.check is None:
                    grade = replace(grade, extracted=None)  # each item gets its own extracted text back
                known[key] = grade
                self._cache[key] = grade
        while len(self._cache) > self.cache_size:  # drop the oldest entries
            del self._cache[next(iter(self._cache))]

        out = []
        for key, ans in zip(keys, extracted):
            grade = known[key] if self.check is not None else replace(known[key], extracted=ans)
            out.append(grade)
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


# --------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), as a stable running product."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"k={k} > n={n}: pass@k needs at least k samples")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(correct: Sequence[bool]) -> float:
    """Mean correctness over the n samples of one problem."""
    if len(correct) == 0:
        raise ValueError("avg_at_k of no samples")
    return sum(bool(x) for x in correct) / len(correct)


def summarize(correct_matrix: Sequence[Sequence[bool]], k: int) -> dict:
    """AVG@k and PASS@k averaged over problems (rows of samples), as fractions in [0, 1]."""
    if len(correct_matrix) == 0:
        raise ValueError("summarize of no problems")
    avgs, passes = [], []
    for row in correct_matrix:
        avgs.append(avg_at_k(row))
        passes.append(pass_at_k(len(row), sum(bool(x) for x in row), k))
    return {
        "avg_at_k": sum(avgs) / len(avgs),
        "pass_at_k": sum(passes) / len(passes),
        "n_problems": len(correct_matrix),
    }
