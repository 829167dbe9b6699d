"""What math-verify reads and what it compares: the gold answer's LaTeX, the extracted answer's text, and
keys that identify a comparison exactly.

The project's grading rule (every AVG@k / PASS@k and every reward goes through it) is math-verify's own:

    math_verify.verify(math_verify.parse(gold_latex(gold)), math_verify.parse(response))

with math-verify's default extraction (``LatexExtractionConfig()`` and ``ExprExtractionConfig()``,
``extraction_mode="any_match"``, ``fallback_mode="first_match"``) and comparison settings
(``float_rounding=6``, ``numeric_precision=15``, ``strict=True``), and its per-call timeouts set to the
Grader's ``timeout`` (math-verify's default is 5 s, the Grader's too). math-verify finds the answer in the
whole response itself (boxes, "final answer is", "Answer:", plain LaTeX and numbers, in its own order of
priority); nothing here pre-extracts or rewrites a response, so there is no extraction of ours to disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["answer_text", "comparison_key", "gold_latex", "integer_verdict"]


def gold_latex(gold: str) -> str:
    """The gold answer as math-verify is given it: benchmark answers are bare LaTeX (``\\frac{1}{2}``,
    ``(3, \\frac{\\pi}{2})``), so they are put in ``$...$`` to be read as LaTeX; a gold that already carries
    math delimiters or a box is passed as it is."""
    s = gold.strip()
    if s.startswith(("$", "\\(", "\\[")) or "\\boxed" in s:
        return gold
    return f"${s}$"


def answer_text(parsed: Sequence[Any]) -> str | None:
    """The answer math-verify extracted, as text (for logs and for counting distinct correct answers): the
    matched string it returns beside the parsed value, else the value printed; None if it found nothing."""
    for item in parsed:
        if isinstance(item, str):
            return item
    if not parsed:
        return None
    try:
        return str(parsed[0])[:300]
    except Exception:  # str() of a sympy object can fail
        return None


def _node_key(expr: Any) -> tuple:
    """An exact, hashable description of a sympy tree: each node's class (module and name, so that two
    classes that print alike stay apart) in pre-order with its number of arguments, and each leaf's
    ``srepr`` (numbers with their precision, symbols with their assumptions)."""
    from sympy import Basic

    out: list[Any] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        cls = type(node)
        name = (cls.__module__, cls.__qualname__)
        args = getattr(node, "args", None) if isinstance(node, Basic) else None
        if args:
            out.append((name, len(args)))
            stack.extend(reversed(args))
        else:
            from sympy import srepr

            out.append((name, srepr(node)))
    return tuple(out)


def comparison_key(parsed: Sequence[Any]) -> tuple | None:
    """A key equal for two ``parse`` results exactly when math-verify would compare the same things: the
    list's items in order, strings as themselves, sympy values by :func:`_node_key`. None when an item is
    of a kind this does not know (then nothing is cached)."""
    from sympy import Basic, MatrixBase

    key: list[Any] = []
    for item in parsed:
        if isinstance(item, str):
            key.append(("str", item))
        elif isinstance(item, Basic):
            key.append(_node_key(item))
        elif isinstance(item, MatrixBase):  # a mutable matrix is not a Basic: its class and entries
            cls = type(item)
            key.append(((cls.__module__, cls.__qualname__), item.shape, tuple(_node_key(x) for x in item)))
        else:
            return None
    return tuple(key)


def integer_verdict(gold: Sequence[Any], pred: Sequence[Any]) -> bool | None:
    """math-verify's verdict, without calling it, when both parses are ``[Integer, text]`` (GSM8K, AIME and
    much of MATH): ``verify`` then compares Integer with Integer (its string test, then its numeric test:
    equal values) and text with text (equal after ``strip``, both non-empty); an Integer and a text never
    match. tests/test_grader_differential.py checks this against math-verify. None for anything else."""

    def split(parsed: Sequence[Any]) -> Sequence[Any] | None:
        ok = len(parsed) == 2 and _is_int(parsed[0]) and isinstance(parsed[1], str)
        return parsed if ok else None

    g, p = split(gold), split(pred)
    if g is None or p is None:
        return None
    same_text = bool(g[1].strip()) and g[1].strip() == p[1].strip()
    return bool(g[0] == p[0]) or same_text


def _is_int(x: Any) -> bool:
    """A sympy integer of one of sympy's integer classes (Integer, Zero, One, NegativeOne), nothing else
    (not a percentage, a bool or a Python int)."""
    from sympy import Integer

    return isinstance(x, Integer) and type(x).__module__.startswith("sympy.core")
