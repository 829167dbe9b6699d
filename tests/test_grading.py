"""Tests of calibrl.grading (math-verify grading, the worker pool) and calibrl.metrics (AVG@k / PASS@k).

That each verdict is math-verify's own is tested against math-verify in test_grader_differential.py."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrl.grading import Grade, Grader, gold_latex, grade_one
from calibrl.metrics import avg_at_k, pass_at_k, summarize

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"
PATHOLOGICAL = [
    (r"\boxed{9^{9^{9^{9^{9}}}}}", "3"),
    ("{" * 10_000 + "}" * 10_000, "1"),
    (r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1"),
    ("x" * 1_000_000, "1"),
]


def _rows(name: str) -> list[dict]:
    path = DATA / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"benchmark file {path} not available")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=2, timeout=1.0) as g:
        yield g


# -- what math-verify reads ---------------------------------------------------------------------------


def test_gold_answers_are_read_as_latex():
    assert gold_latex("\\frac{1}{2}") == "$\\frac{1}{2}$"
    assert gold_latex(" 18 ") == "$18$"
    for delimited in ("$x$", "\\(x\\)", "\\[x\\]", "\\boxed{3}"):
        assert gold_latex(delimited) == delimited


def test_extracted_is_the_answer_math_verify_found():
    assert grade_one(r"Thus $\boxed{\frac{1}{2^{n}}}$.", "1").extracted == r"\frac{1}{2^{n}}"
    assert grade_one("so the answer is 5.\nDone", "5").extracted == "5"
    assert grade_one("no final answer here", "3") == Grade(False, None)


# -- grade_one ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        (r"\frac{1}{2}", "0.5"),
        ("The answer is 0.5", r"\frac{1}{2}"),
        (r"We conclude that the result is \boxed{3} as claimed.", "3"),
        (r"\boxed{\dfrac{9}{7}}", r"\frac{9}{7}"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        ("The answer is $18.", r"\$18"),
    ],
)
def test_grade_one_equivalent_forms(response, gold):
    grade = grade_one(response, gold)
    assert grade == Grade(True, grade.extracted, False, None)


def test_grade_one_wrong_answers():
    assert not grade_one(r"so \boxed{4}", "3").correct
    assert not grade_one(r"\boxed{\frac{1}{3}}", "0.5").correct
    assert not grade_one("I do not know", "3").correct


def test_grade_one_never_raises():
    grade = grade_one(None, "3")  # type: ignore[arg-type]
    assert not grade.correct and grade.error is not None and "TypeError" in grade.error
    grade = grade_one(r"\boxed{9^{9^{9^{9^{9}}}}}", "3", timeout=1)
    assert not grade.correct and grade.timed_out


# -- real benchmark data -----------------------------------------------------------------------------


def test_math500_reference_solutions_grade_correct():
    rows = random.Random(0).sample(_rows("math500"), 100)
    correct = sum(grade_one(r["solution"], r["answer"]).correct for r in rows)
    assert correct >= 97


def test_math500_shuffled_pairing_grades_wrong():
    rows = random.Random(1).sample(_rows("math500"), 100)
    golds = [r["answer"] for r in rows[1:] + rows[:1]]  # every solution gets another problem's answer
    correct = sum(grade_one(r["solution"], g).correct for r, g in zip(rows, golds))
    assert correct <= 5


def test_gsm8k_answer_is_format(grader):
    rows = random.Random(2).sample(_rows("gsm8k_test"), 100)
    grades = grader.grade([(f"Let me think step by step.\nThe answer is {r['answer']}", r["answer"]) for r in rows])
    assert all(g.correct for g in grades), [(r["answer"], g) for r, g in zip(rows, grades) if not g.correct]


# -- Grader ------------------------------------------------------------------------------------------


def test_grader_survives_pathological_responses(grader):
    t0 = time.monotonic()
    grades = grader.grade(PATHOLOGICAL + [("a" * 1_000_000 + r"\boxed{7}", "7")])
    elapsed = time.monotonic() - t0
    assert all(isinstance(g, Grade) for g in grades)
    assert [g.correct for g in grades] == [False, False, False, False, True]  # math-verify reads all 1 MB
    assert grades[0].timed_out
    assert elapsed < 3 * grader.hang_after + 5


def test_a_box_early_in_a_long_response_counts_as_math_verify_finds_it(grader):
    # A model that boxes its answer and then keeps checking for 30,000 characters: math-verify reads the
    # whole response and finds the box, so the Grader must not cut it off; nor the final "7" of a response
    # without any cue (math-verify's last resort: the last number).
    rambling = "We check the result once more. " * 1000
    boxed_early, no_answer = (r"So \boxed{\frac{3}{4}}. " + rambling, "3 / 4"), (rambling + "7", "7")
    assert len(boxed_early[0]) > 30_000
    import math_verify

    for response, gold in (boxed_early, no_answer):
        assert math_verify.verify(math_verify.parse(gold_latex(gold)), math_verify.parse(response))
    assert [g.correct for g in grader.grade([boxed_early, no_answer])] == [True, True]


def test_grader_cache_and_stats(grader):
    before = dict(grader.stats)
    pairs = [
        (r"\boxed{4321}", "4321"),
        (r"so \boxed{ 4321 }", "4321"),
        (r"\boxed{4321}", "4321"),
        (r"\boxed{13}", "4321"),
    ]
    grades = grader.grade(pairs)
    assert [g.correct for g in grades] == [True, True, True, False]
    assert [g.extracted for g in grades] == ["4321", "4321", "4321", "13"]
    assert grader.stats["items"] - before["items"] == 4
    assert grader.stats["cache_hits"] - before["cache_hits"] == 1  # the exact repeat (math-verify reads it all)
    grader.grade(pairs)
    assert grader.stats["cache_hits"] - before["cache_hits"] == 5
    assert set(grader.stats) == {"items", "cache_hits", "timeouts", "errors"}


def test_grader_kills_hung_worker_and_recovers():
    with Grader(workers=2, timeout=1.0, chunk_size=4) as g:
        g.hang_after = 0.5  # the 1 s math-verify timeout of the first item now counts as a hang
        pairs = [(r"\boxed{9^{9^{9^{9^{9}}}}}", "3")] + [(rf"\boxed{{{i}}}", str(i)) for i in range(12)]
        t0 = time.monotonic()
        grades = g.grade(pairs)
        assert time.monotonic() - t0 < 20
        assert grades[0].timed_out and not grades[0].correct and "hung" in (grades[0].error or "")
        assert all(x.correct for x in grades[1:])
        assert g.grade([(r"\boxed{5}", "5")])[0].correct  # a fresh pool works


def test_grader_recovers_from_a_dead_worker():
    with Grader(workers=2, timeout=1.0) as g:
        assert g.grade([(r"\boxed{\frac{1}{2}}", "0.5")])[0].correct  # starts the workers (not an integer pair)
        pids = list(g._pool._processes)  # the workers this test's Grader started

        def cpu_ticks(pid: int) -> int:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks

        def kill_workers():
            # event-driven, not timed: kill once a worker is computing (the towers hang it until the 1 s
            # timeout; the three items are one chunk), however loaded the machine is
            start = {pid: cpu_ticks(pid) for pid in pids}
            deadline = time.monotonic() + 60
            while all(cpu_ticks(pid) < start[pid] + 3 for pid in pids) and time.monotonic() < deadline:
                time.sleep(0.01)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_workers)
        killer.start()
        pairs = [
            (r"\boxed{9^{9^{9^{9^{9}}}}}", "3"),
            (r"\boxed{9^{9^{9^{9^{8}}}}}", "3"),
            (r"\boxed{2}", "2"),
        ]
        grades = g.grade(pairs)
        killer.join()
        assert [x.correct for x in grades] == [False, False, True]
        assert grades[0].timed_out and grades[1].timed_out


def test_the_workers_end_when_the_process_owning_the_pool_is_killed(tmp_path):
    """A Ray actor stopped with its cluster is SIGKILLed with its Grader open: its workers (children of the
    forkserver, blocked on a queue they hold both ends of) end too instead of staying idle."""
    import subprocess
    import sys

    code = (
        "import os, sys, time; from calibrl.grading import Grader; g = Grader(workers=2, timeout=5.0); "
        "g.grade([('\\\\boxed{1}', '1')]); print(*g._pool._processes, flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert workers and all(_alive(pid) for pid in workers)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_grader_with_torch_in_parent():
    torch = pytest.importorskip("torch")
    torch.ones(256, 256) @ torch.ones(256, 256)  # start torch's thread pool before the workers
    with Grader(workers=2, timeout=1.0) as g:
        grades = g.grade([(rf"\boxed{{{i}/2}}", str(i / 2)) for i in range(20)])
    assert all(x.correct for x in grades)


def test_grader_in_process_and_bounded_cache():
    with Grader(workers=0, timeout=1.0, cache_size=2) as g:
        grades = g.grade([(r"\boxed{\frac{1}{2}}", "0.5"), ("The answer is 2/3", "3"), ("no answer", "3")])
        assert [x.correct for x in grades] == [True, False, False]
        assert [x.extracted for x in grades] == [r"\frac{1}{2}", "2/3", None]
        assert g.stats["items"] == 3 and len(g._cache) == 2
        assert g.grade([("The answer is 2/3", "3")] * 2)[0].extracted == "2/3"
        assert g.stats["cache_hits"] == 2


# -- metrics -----------------------------------------------------------------------------------------


def test_pass_at_k_hand_values():
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(10, 2, 8) == pytest.approx(1 - 1 / 45)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_properties(nck):
    n, c, k = nck
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert value == pytest.approx(float(exact), abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12


def test_avg_and_summarize():
    assert avg_at_k([True, False, True, True]) == 0.75
    rows = [[True] * 4, [False] * 4, [True, False, False, False]]
    out = summarize(rows, k=2)
    assert out["n_problems"] == 3
    assert out["avg_at_k"] == pytest.approx((1 + 0 + 0.25) / 3)
    assert out["pass_at_k"] == pytest.approx((1 + 0 + 0.5) / 3)
