"""math-verify on one (response, gold) pair: ``math_verify.verify(parse(gold_latex(gold)), parse(response))``,
made never to raise, with the timeouts reported, and with caches that cannot change a verdict.

The speed-ups, each equal to math-verify by construction or by test:

- the gold's parse is cached (a gold answer repeats for every sample of its problem);
- ``verify`` is cached on :func:`~calibrl.grading.answer.comparison_key`, an exact description of what it
  compares, so a final answer that recurs in different responses is compared once;
- two ``[Integer, text]`` parses get :func:`~calibrl.grading.answer.integer_verdict` without sympy;
- in worker processes, math-verify's own LaTeX and expression parse caches (20 entries each) are widened
  (:func:`widen_math_verify_caches`): the same pure functions, remembered longer.

Timeouts and errors are never cached.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from calibrl.grading.answer import answer_text, comparison_key, gold_latex, integer_verdict

__all__ = ["Grade", "gold_check", "grade_one", "widen_math_verify_caches"]

_ERROR_CHARS = 300  # error messages are truncated: math-verify puts the whole input into some of them
_VERIFY_CACHE_SIZE = 200_000
_verify_cache: dict[tuple, bool] = {}


@dataclass(frozen=True)
class Grade:
    """Outcome of grading one response. ``extracted`` is the answer math-verify found, as text (None if
    none); ``timed_out``/``error`` only matter when ``correct`` is False."""

    correct: bool
    extracted: str | None
    timed_out: bool = False
    error: str | None = None


def seconds(timeout: float) -> int:
    """math-verify feeds its timeouts to ``signal.alarm``, which takes whole seconds (0 disables it)."""
    return max(1, math.ceil(timeout))


def _error_text(exc: BaseException) -> str:
    try:
        msg = f"{type(exc).__name__}: {exc}"
    except Exception:  # a str() that fails is possible with sympy objects
        msg = type(exc).__name__
    return msg[:_ERROR_CHARS]


def _secs(timeout: float) -> int | None:
    """Signal timeouts work only in a process's main thread: elsewhere they are off (as math-verify asks)."""
    return seconds(timeout) if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, secs: int | None) -> list[Any]:
    import math_verify

    # math-verify's defaults except the timeout; raise_on_error only tells an error from "found nothing"
    # (math-verify returns [] for both, and [] is graded wrong either way).
    return math_verify.parse(text, parsing_timeout=secs, raise_on_error=True)


@lru_cache(maxsize=8192)
def _parse_gold(gold: str, secs: int | None) -> tuple[Any, ...]:
    return tuple(_parse(gold_latex(gold), secs))


def widen_math_verify_caches(size: int = 4096) -> None:
    """Give math-verify's ``parse_latex_cached`` / ``parse_expr_cached`` (pure functions of one string,
    ``lru_cache(maxsize=20)``) a larger cache: the same answer in another response is then not re-parsed by
    ANTLR. Left alone if math-verify's internals are not as expected. Called in worker processes only."""
    try:
        from math_verify import parser
    except ImportError:
        return
    for name in ("parse_latex_cached", "parse_expr_cached"):
        fn = getattr(parser, name, None)
        inner = getattr(fn, "__wrapped__", None)
        if inner is not None and hasattr(fn, "cache_info") and fn.cache_info().maxsize < size:
            setattr(parser, name, lru_cache(maxsize=size)(inner))


def gold_check(response: str, gold: str, timeout: float = 5.0) -> Grade:
    """A :class:`Grader` ``check`` that tests the gold answer alone (``response`` is ignored): ``correct``
    when math-verify parses it to something; a gold that parses to nothing can never be matched."""
    from math_verify.errors import TimeoutException

    try:
        if _parse_gold(str(gold), _secs(timeout)):
            return Grade(True, None)
        return Grade(False, None, error="gold answer did not parse")
    except TimeoutException:
        return Grade(False, None, timed_out=True)
    except Exception as exc:
        return Grade(False, None, error=_error_text(exc))


def grade_one(response: str, gold: str, timeout: float = 5.0) -> Grade:
    """math-verify's verdict on ``response`` against ``gold``; never raises.

    Each math-verify call (two parses, and one comparison per (gold, prediction) pair, at most four) gets
    ``timeout`` rounded up to whole seconds, math-verify's own per-call timeouts; a call that times out
    counts as no match, as in math-verify, and the grade says ``timed_out``.
    """
    from math_verify.errors import TimeoutException

    extracted: str | None = None
    try:
        if not isinstance(response, str) or not isinstance(gold, str):
            raise TypeError("response and gold must be str")
        secs = _secs(timeout)
        gold_parsed = _parse_gold(gold, secs)
        if not gold_parsed:
            return Grade(False, None, error="gold answer did not parse")
        pred = _parse(response, secs)
        extracted = answer_text(pred)
        if not pred:
            return Grade(False, None)
        fast = integer_verdict(gold_parsed, pred)
        if fast is not None:
            return Grade(fast, extracted)
        pred_key = comparison_key(pred)
        key = None if pred_key is None else (gold, pred_key)
        if key is not None and key in _verify_cache:
            return Grade(_verify_cache[key], extracted)
        verdict, error, timed_out = _verify(gold_parsed, pred, secs)
        if key is not None and error is None and not timed_out:
            if len(_verify_cache) >= _VERIFY_CACHE_SIZE:
                _verify_cache.clear()
            _verify_cache[key] = verdict
        return Grade(verdict, extracted, timed_out=timed_out and not verdict, error=None if verdict else error)
    except TimeoutException:
        return Grade(False, extracted, timed_out=True)
    except Exception as exc:  # grading must never take the caller down
        return Grade(False, extracted, error=_error_text(exc))


def _verify(gold: Sequence[Any], pred: Sequence[Any], secs: int | None) -> tuple[bool, str | None, bool]:
    """``math_verify.verify(gold, pred)``: True if any (gold, prediction) pair matches, in its order, each
    pair a call of its own so that a timeout or an error in one is seen (verify counts either as no match
    and goes on, as this does). Returns (verdict, first error, whether a pair timed out)."""
    import math_verify
    from math_verify.errors import TimeoutException

    timed_out = False
    error = None
    for g in gold:
        for p in pred:
            try:
                if math_verify.verify(g, p, timeout_seconds=secs, raise_on_error=True):
                    return True, None, False
            except TimeoutException:
                timed_out = True
            except Exception as exc:
                error = error or _error_text(exc)
    return False, error, timed_out
