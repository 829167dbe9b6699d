"""A countdown-style verifiable task with several correct answers per problem.

A problem is a multiset of small positive integers and a target, written compactly as the prompt
``"3 7 12 5 -> 15"``. A correct answer is ONE binary expression ``a op b`` with ``op`` in ``+ - *``
that uses two of the given numbers (each occurrence at most once: ``5+5`` needs two 5s) and equals the
target, e.g. ``12+3``, ``3*5`` or ``20-5``. Answers are identified by their canonical form: for the
commutative ops the smaller operand comes first (``3+12``, ``3*5``); ``a-b`` stays as written. The
distinct canonical forms are the task's solution modes, so a policy that keeps writing ``3+12`` and
never ``3*5`` has lost a mode.

Splits (:data:`SPLITS`): ``sft`` (the warm start's problems), ``train`` (RL's) and ``test`` draw 4 numbers
from 1..20; ``ood`` draws 5 numbers from 1..30 and uses larger targets (at least 25). In every split 85% of
the problems (17 in each block of 20) have at least two distinct solutions, the rest exactly one. ``sft``,
``train`` and ``test`` are disjoint by problem (the sorted numbers and the target, hence also by text): a
stable hash sends every in-distribution problem to exactly one of them, whatever the seeds (1 in 10 to
``test``, 1 in 10 to ``train``, the rest to ``sft``), so RL trains on problems its warm start never saw and is
tested on problems neither saw. Records follow :mod:`calibrl.data.records`;
the gold ``answer`` is the target as a string and ``verifier`` holds ``{"numbers", "target", "solutions"}``.

Grading (:func:`check`) parses the response strictly (:func:`parse_expression`, no eval), checks the
operands against the multiset, then compares the value with the gold answer using math-verify.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

OPS = ("+", "-", "*")
MAX_DIGITS = 6  # operands longer than this are malformed (bounds the work and the int size)
_DIGITS = frozenset("0123456789")
_SPACE = frozenset(" \t")
_END = frozenset("\n=")  # the expression stops here; what follows is ignored


@dataclass(frozen=True)
class SplitSpec:
    """How one split's problems are drawn."""

    n_numbers: int  # numbers in the multiset, drawn i.i.d. uniform from lo..hi
    lo: int
    hi: int
    min_target: int  # targets are achievable values in min_target..max_target
    max_target: int
    p_multi: float  # fraction of problems generated to have >= 2 distinct solutions (see BLOCK)


SPLITS: dict[str, SplitSpec] = {
    "sft": SplitSpec(n_numbers=4, lo=1, hi=20, min_target=1, max_target=400, p_multi=0.85),
    "train": SplitSpec(n_numbers=4, lo=1, hi=20, min_target=1, max_target=400, p_multi=0.85),
    "test": SplitSpec(n_numbers=4, lo=1, hi=20, min_target=1, max_target=400, p_multi=0.85),
    "ood": SplitSpec(n_numbers=5, lo=1, hi=30, min_target=25, max_target=900, p_multi=0.85),
}
MAX_MISSES = 50_000  # generate() gives up after this many draws in a row without a new problem
BLOCK = 20  # every block of BLOCK consecutive problems has exactly round(p_multi * BLOCK) multi-solution ones
BUCKETS = 10  # an in-distribution problem's hash mod BUCKETS: 0 -> ``test``, 1 -> ``train``, the rest -> ``sft``


# ------------------------------------------------------------------ answers


def canonical(a: int, op: str, b: int) -> str:
    """Canonical text of ``a op b``: ``+`` and ``*`` with the smaller operand first, ``-`` as written."""
    if op not in OPS:
        raise ValueError(f"unknown operator {op!r}")
    if op != "-" and a > b:
        a, b = b, a
    return f"{a}{op}{b}"


def evaluate(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def _solution_table(numbers: Sequence[int]) -> dict[int, set[str]]:
    """Every value reachable with two of ``numbers`` -> the canonical expressions giving it."""
    table: dict[int, set[str]] = defaultdict(set)
    for i, j in itertools.permutations(range(len(numbers)), 2):
        a, b = numbers[i], numbers[j]
        for op in OPS:
            table[evaluate(a, op, b)].add(canonical(a, op, b))
    return table


def solutions(numbers: Sequence[int], target: int) -> list[str]:
    """All distinct canonical correct answers for ``numbers`` and ``target`` (brute force), sorted."""
    return sorted(_solution_table(list(numbers)).get(target, ()))


def _uses_available(numbers: Sequence[int], a: int, b: int) -> bool:
    """True if ``a`` and ``b`` are two distinct occurrences in the multiset ``numbers``."""
    need = Counter((a, b))
    have = Counter(numbers)
    return all(have[x] >= k for x, k in need.items())


# ------------------------------------------------------------------ parsing


def _skip(text: str, i: int, chars: frozenset[str]) -> int:
    n = len(text)
    while i < n and text[i] in chars:
        i += 1
    return i


def _read_int(text: str, i: int) -> tuple[int | None, int]:
    """An ASCII decimal without sign or leading zeros starting at ``i`` (at most MAX_DIGITS digits)."""
    j = i
    n = min(len(text), i + MAX_DIGITS + 1)
    while j < n and text[j] in _DIGITS:
        j += 1
    digits = text[i:j]
    if not digits or len(digits) > MAX_DIGITS or (len(digits) > 1 and digits[0] == "0"):
        return None, j
    return int(digits), j


def parse_expression(text: str) -> tuple[int, str, int] | None:
    """The expression ``a op b`` the response starts with, or None if it is malformed.

    Grammar: optional spaces/tabs, an integer, optional spaces/tabs, one of ``+ - *``, optional
    spaces/tabs, an integer, optional spaces/tabs/CR, then the end of the text, a newline or ``=``
    (everything after that is ignored, so ``"12+3=15"`` and ``"12+3\\n..."`` parse). Integers are ASCII
    digits without sign or leading zeros, at most :data:`MAX_DIGITS` long. Anything else -- a third
    operand (``1+2+3``), parentheses, trailing words, a leading ``-`` -- makes the response malformed.
    A single left-to-right scan: linear time, no ``eval``.
    """
    if not isinstance(text, str):
        return None
    i = _skip(text, 0, _SPACE)
    a, i = _read_int(text, i)
    if a is None:
        return None
    i = _skip(text, i, _SPACE)
    if i >= len(text) or text[i] not in OPS:
        return None
    op = text[i]
    i = _skip(text, i + 1, _SPACE)
    b, i = _read_int(text, i)
    if b is None:
        return None
    i = _skip(text, i, _SPACE | {"\r"})
    if i < len(text) and text[i] not in _END:
        return None
    return a, op, b


def format_problem(numbers: Sequence[int], target: int) -> str:
    return " ".join(str(x) for x in numbers) + f" -> {target}"


def parse_problem(text: str) -> tuple[list[int], int] | None:
    """Inverse of :func:`format_problem`: ``"3 7 12 5 -> 15"`` -> ``([3, 7, 12, 5], 15)``."""
    left, sep, right = text.partition("->")
    try:
        numbers = [int(tok) for tok in left.split()]
        target = int(right.strip())
    except ValueError:
        return None
    if not sep or not numbers:
        return None
    return numbers, target


# ------------------------------------------------------------------ grading


def _main_thread() -> bool:
    # math-verify's timeouts use signal.alarm, which only works in the main thread; the expressions
    # here are two bounded integers, so off the main thread the timeouts are simply turned off.
    return threading.current_thread() is threading.main_thread()


# math-verify's parse and verify are pure functions of their inputs, and the inputs recur all the time (about a
# hundred targets, `a op b` over small numbers): each distinct string is parsed once per process and each distinct
# pair compared once, so the verdict is math-verify's without re-parsing the same text every step.
@lru_cache(maxsize=1 << 14)
def _parse(text: str) -> tuple:
    import math_verify  # imported lazily: sympy is slow to import and only graders need it

    return tuple(math_verify.parse(text) if _main_thread() else math_verify.parse(text, parsing_timeout=None))


@lru_cache(maxsize=1 << 16)
def _math_verify_equal(gold: str, expression: str) -> bool:
    import math_verify

    gold_parsed, expr_parsed = list(_parse(gold)), list(_parse(expression))
    if _main_thread():
        return bool(math_verify.verify(gold_parsed, expr_parsed))
    return bool(math_verify.verify(gold_parsed, expr_parsed, timeout_seconds=None))


def _record_numbers(record: Mapping) -> list[int] | None:
    verifier = record.get("verifier") or {}
    numbers = verifier.get("numbers")
    if numbers is None:
        parsed = parse_problem(str(record.get("problem", "")))
        numbers = parsed[0] if parsed else None
    return list(numbers) if numbers is not None else None


def check(response: str, record: Mapping) -> tuple[bool, str | None]:
    """Grade one response: ``(correct, canonical answer if correct else None)``.

    The response must start with ``a op b`` (:func:`parse_expression`); ``a`` and ``b`` must be two
    occurrences in the problem's multiset (``record["verifier"]["numbers"]``, else parsed from
    ``record["problem"]``); the value is then checked with math-verify against ``record["answer"]``:
    ``verify(parse(answer), parse("a op b"))``. A pure module-level function, so it can be shipped to a
    ``ProcessPoolExecutor``.
    """
    parsed = parse_expression(response)
    if parsed is None:
        return False, None
    a, op, b = parsed
    numbers = _record_numbers(record)
    if numbers is None or not _uses_available(numbers, a, b):
        return False, None
    if not _math_verify_equal(str(record["answer"]), f"{a}{op}{b}"):
        return False, None
    return True, canonical(a, op, b)


def sample_solution(record: Mapping, rng: random.Random) -> str:
    """A correct answer drawn uniformly over the record's solution modes, in a random valid order.

    ``+`` and ``*`` answers come out either way round (``3+12`` or ``12+3``); ``-`` as it must be.
    For supervised warm-start data: uniform over modes, so the warm-started policy covers all of them.
    """
    verifier = record.get("verifier") or {}
    sols = verifier.get("solutions")
    if sols is None:
        numbers = _record_numbers(record)
        sols = solutions(numbers or [], int(record["answer"]))
    if not sols:
        raise ValueError(f"record {record.get('id')!r} has no solution")
    a, op, b = parse_expression(rng.choice(sorted(sols)))
    if op != "-" and rng.random() < 0.5:
        a, b = b, a
    return f"{a}{op}{b}"


# ------------------------------------------------------------------ generation


def _bucket(numbers: Sequence[int], target: int) -> str:
    """The in-distribution split a problem belongs to, from a stable hash of it (the same whatever the seeds)."""
    key = " ".join(str(x) for x in sorted(numbers)) + f" -> {target}"
    digest = hashlib.sha256(key.encode()).digest()
    return {0: "test", 1: "train"}.get(int.from_bytes(digest[:8], "big") % BUCKETS, "sft")


def _block_flags(p_multi: float, rng: random.Random) -> list[bool]:
    """Multi-solution flags for the next BLOCK problems: exactly round(p_multi * BLOCK) True, shuffled."""
    k = round(p_multi * BLOCK)
    flags = [True] * k + [False] * (BLOCK - k)
    rng.shuffle(flags)
    return flags


def generate(split: str, n: int, seed: int) -> list[dict]:
    """``n`` distinct problems of ``split`` (``sft``, ``train``, ``test`` or ``ood``), deterministic in ``seed``.

    Each problem is first assigned two-or-more solutions or exactly one: in every block of
    :data:`BLOCK` consecutive problems exactly ``round(p_multi * BLOCK)`` get two or more, at random
    positions, so the fraction holds for small ``n`` too (and a shorter run is a prefix of a longer
    one). Then numbers are drawn until some achievable value in the split's target range has that many
    solutions and is neither already drawn (same sorted numbers and target) nor, for ``sft``/``train``/``test``,
    a problem of another of them (:func:`_bucket`); the target is drawn among those values (weighted by
    ``n_solutions - 1`` for multi-solution problems, so 3- and 4-solution targets are favoured).

    Raises ``ValueError`` when ``n`` distinct problems cannot be found: the in-distribution space is
    small (about 8.3k problems with two or more solutions in all), so ``sft`` tops out near 7.7k
    problems and ``train`` and ``test`` near 1k each; ``ood`` has room for far more.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    spec = SPLITS[split]
    rng = random.Random(f"countdown:{split}:{seed}")
    bucketed = split in ("sft", "train", "test")
    seen: set[tuple[tuple[int, ...], int]] = set()
    records: list[dict] = []
    misses = 0  # number draws since the last new problem
    flags: list[bool] = []  # multi-solution or not, for the rest of the current block of problems
    while len(records) < n:
        misses += 1
        if misses > MAX_MISSES:
            raise ValueError(
                f"countdown {split}: found only {len(records)} distinct problems of {n} "
                f"requested ({MAX_MISSES} draws in a row gave nothing new); ask for fewer"
            )
        if not flags:
            flags = _block_flags(spec.p_multi, rng)
        want_multi = flags[-1]
        numbers = [rng.randint(spec.lo, spec.hi) for _ in range(spec.n_numbers)]
        table = _solution_table(numbers)
        sorted_numbers = tuple(sorted(numbers))
        pool = [
            v
            for v in sorted(table)
            if spec.min_target <= v <= spec.max_target
            and (len(table[v]) >= 2) == want_multi
            and (sorted_numbers, v) not in seen
            and (not bucketed or _bucket(numbers, v) == split)
        ]
        if not pool:
            continue
        if want_multi:
            target = rng.choices(pool, weights=[len(table[v]) - 1 for v in pool])[0]
        else:
            target = rng.choice(pool)
        key = (sorted_numbers, target)
        seen.add(key)
        misses = 0
        flags.pop()
        index = len(records)
        records.append(
            {
                "id": f"countdown-{split}-{index:06d}",
                "problem": format_problem(numbers, target),
                "answer": str(target),
                "source": f"countdown-{split}",
                "verifier": {"numbers": numbers, "target": target, "solutions": sorted(table[target])},
            }
        )
    return records
