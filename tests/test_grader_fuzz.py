"""Untrusted model output through the real Grader (worker processes, timeouts): thousands of generated
adversarial responses (enormous, deeply nested, LaTeX traps, huge exponents, code) are each graded within
their time budget, never crash or hang the job, timeouts are counted, and nothing in them is executed.

Why nothing can run: math-verify reads LaTeX with an ANTLR grammar (latex2sympy2_extended), and only hands
strings to sympy's ``parse_expr`` (which evaluates Python) when they match its arithmetic-expression regex:
digits, '.', whitespace and + - * x / ^ ( ) ÷, so no name, attribute or call can reach it. The code payloads
below would create a sentinel file if any of them ran.
"""

import json
import time
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibrl.grading import Grade, Grader
from calibrl.metrics import split_metrics

BATCH = 50
EXAMPLES = 100  # x BATCH = 5,000 generated responses
TIMEOUT = 1.0


def golds() -> list[str]:
    path = SHARED_DATA / "benchmarks" / "math500.jsonl"
    if not path.is_file():
        return ["\\frac{1}{2}", "42", "x^2+1", "\\sqrt{3}", "(1, 2)"]
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:8]]
    return [r["answer"] for r in rows]


def payloads(sentinel: Path) -> list[str]:
    s = str(sentinel)
    return [
        f"__import__('os').system('touch {s}')",
        f"eval(\"open('{s}', 'w')\")",
        f"exec('import os; os.system(\"touch {s}\")')",
        f"(lambda: open('{s}', 'w'))()",
        "().__class__.__bases__[0].__subclasses__()",
        f"\\text{{{s}}}\\input{{/etc/passwd}}\\write18{{touch {s}}}",
        f"1+__import__('pathlib').Path('{s}').touch()",
    ]


TRAPS = [
    "\\boxed{",
    "\\left(",
    "\\right]",
    "\\begin{array}{cc}1&2\\\\",
    "\\end{pmatrix}",
    "\\frac12",
    "\\over",
    "$$",
    "\\\\",
    "\\text{",
    "\\sqrt[",
    "^{-}",
    "\\infty",
    "\\mathbb{R}",
    "}",
    "{",
    "\x00",
    "∞∑∫√",
    "\\boxed{\\boxed{}}",
    "\\fbox{1}",
    "answer is",
]
# Responses that exhaust the time budget (a power sympy would compute in C, nesting hundreds deep, a 20k-char
# sum): a fixed few, whole, so that the Grader's cache absorbs their repeats and the suite stays fast.
HEAVY = [
    "\\boxed{9^{9^{9^{9^{9}}}}}",
    "The answer is 10**10**10**10.",
    "\\boxed{" + "\\frac{1}{" * 400 + "2" + "}" * 400 + "}",
    "so 2^(2^(2^(2^100)))",
    "1+" * 10000 + "1",
    "\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}",
    "The answer is " + "{" * 3000 + "1" + "}" * 3000 + ".",
    "$$" + "\\sqrt{" * 200 + "2" + "}" * 200 + "$$",
]


@st.composite
def response(draw, sentinel: Path) -> str:
    if draw(st.integers(0, 49)) == 0:  # 2%
        return draw(st.sampled_from(HEAVY))
    piece = st.one_of(
        st.sampled_from(payloads(sentinel)),
        st.sampled_from(TRAPS),
        # nesting deep enough to be a trap, shallow enough to parse (deeper: HEAVY, whose parse times out)
        st.integers(1, 8).map(lambda d: "\\frac{1}{" * d + "2" + "}" * d),
        st.integers(1, 10).map(lambda d: "{" * d + "1" + "}" * d),
        st.integers(1, 8).map(lambda d: "\\sqrt{" * d + "2" + "}" * d),
        st.integers(1, 10).map(lambda d: "(" * d + "1" + ")" * d),
        st.integers(1, 2).map(lambda e: f"{'9' * e}^{{{'9' * e}}}"),
        st.text(max_size=200),
    )
    body = "".join(draw(st.lists(piece, min_size=1, max_size=5)))
    wrap = draw(st.sampled_from(["{}", "\\boxed{{{}}}", "The answer is {}.", "$${}$$", "\\boxed{{{}", "{}" * 3]))
    text = wrap.format(*([body] * wrap.count("{}")))
    if draw(st.integers(0, 40)) == 0:  # now and then an enormous response
        text = text * draw(st.integers(100, 2000))
    return text


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=2, timeout=TIMEOUT) as g:
        yield g


def test_fuzzed_outputs_are_graded_safely(grader, tmp_path_factory):
    sentinel = tmp_path_factory.mktemp("fuzz") / "executed"
    gold_answers = golds()
    seen = {"items": 0, "slowest_batch": 0.0}
    gold = st.sampled_from(gold_answers[:2])  # few golds: repeats of a heavy response hit the cache

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # the same inputs on every run: CI is reproducible
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(st.tuples(response(sentinel), gold), min_size=BATCH, max_size=BATCH))
    def check(pairs):
        start = time.monotonic()
        grades = grader.grade(pairs)
        elapsed = time.monotonic() - start
        assert len(grades) == len(pairs) and all(isinstance(g, Grade) for g in grades)
        # Each item is bounded by the hang limit (3 x timeout + grace) plus a worker restart; two workers.
        assert elapsed < len(pairs) * (3 * TIMEOUT + 3) / 2
        assert not sentinel.exists(), "a model output was executed"
        seen["items"] += len(pairs)
        seen["slowest_batch"] = max(seen["slowest_batch"], elapsed)

    check()
    print(f"graded {seen['items']} fuzzed responses; slowest batch {seen['slowest_batch']:.1f} s; {grader.stats}")
    assert seen["items"] == EXAMPLES * BATCH
    assert not sentinel.exists()
    assert grader.stats["items"] >= EXAMPLES * BATCH


def test_timeouts_are_counted_in_the_metrics(grader):
    hung = "\\boxed{9^{9^{9^{9^{9}}}}}"  # sympy would compute this power in C, where no alarm reaches it
    before = grader.stats["timeouts"]
    grades = grader.grade([(hung, "3"), ("\\boxed{3}", "3"), (hung + " ", "3"), ("\\boxed{4}", "3")])
    assert [g.correct for g in grades] == [False, True, False, False]
    assert grades[0].timed_out and not grades[1].timed_out and not grades[3].timed_out
    assert grader.stats["timeouts"] >= before + 1
    metrics = split_metrics([grades[:2], grades[2:]], [5, 5, 5, 5], k=2)
    assert metrics["timeouts"] == sum(g.timed_out for g in grades) >= 1
    assert metrics["pass_at_2"] == 0.5


def test_the_payloads_would_run_if_evaluated(tmp_path):
    """The sentinel check can fail: evaluating a payload with Python creates the file."""
    sentinel = tmp_path / "executed"
    eval(payloads(sentinel)[0])  # noqa: S307 - the point of the test
    assert sentinel.exists()
