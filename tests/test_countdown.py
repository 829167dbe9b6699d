"""The countdown task: generation, parsing and grading (math-verify for the value)."""

import multiprocessing
import pickle
import random
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibrl.data import countdown as cd
from calibrl.data.records import read_jsonl, record_problem, write_jsonl


@pytest.fixture(scope="module")
def splits():
    return {
        "train": cd.generate("train", 600, seed=0),
        "test": cd.generate("test", 300, seed=0),
        "ood": cd.generate("ood", 200, seed=0),
    }


def _record(numbers, target):
    verifier = {"numbers": list(numbers), "target": target, "solutions": cd.solutions(numbers, target)}
    return {
        "id": "x",
        "problem": cd.format_problem(numbers, target),
        "answer": str(target),
        "source": "t",
        "verifier": verifier,
    }


# ------------------------------------------------------------------ generation


def test_deterministic_per_seed():
    assert cd.generate("train", 50, seed=3) == cd.generate("train", 50, seed=3)
    assert cd.generate("train", 50, seed=3) != cd.generate("train", 50, seed=4)
    assert cd.generate("ood", 20, seed=3) == cd.generate("ood", 20, seed=3)
    assert cd.generate("train", 80, seed=5)[:30] == cd.generate("train", 30, seed=5)  # prefix-stable


def test_record_schema_ids_and_lengths(splits):
    for split, recs in splits.items():
        assert len({r["id"] for r in recs}) == len(recs)
        assert len({r["problem"] for r in recs}) == len(recs)
        for i, r in enumerate(recs):
            assert record_problem(r) is None
            assert r["id"] == f"countdown-{split}-{i:06d}"
            assert r["source"] == f"countdown-{split}"
            assert len(r["problem"]) < 40
            v = r["verifier"]
            assert r["answer"] == str(v["target"]) and v["target"] > 0
            assert cd.parse_problem(r["problem"]) == (v["numbers"], v["target"])
            assert v["solutions"] == cd.solutions(v["numbers"], v["target"]) and v["solutions"]


def test_split_shapes(splits):
    for split in ("train", "test"):
        for r in splits[split]:
            assert len(r["verifier"]["numbers"]) == 4 and all(1 <= x <= 20 for x in r["verifier"]["numbers"])
    for r in splits["ood"]:
        assert len(r["verifier"]["numbers"]) == 5 and all(1 <= x <= 30 for x in r["verifier"]["numbers"])
        assert r["verifier"]["target"] >= cd.SPLITS["ood"].min_target


def test_train_test_disjoint_whatever_the_seeds(splits):
    def keys(recs):
        return {(tuple(sorted(r["verifier"]["numbers"])), r["verifier"]["target"]) for r in recs}

    train = keys(splits["train"]) | keys(cd.generate("train", 300, seed=11))
    test = keys(splits["test"]) | keys(cd.generate("test", 300, seed=12))
    assert not train & test
    texts = {r["problem"] for recs in splits.values() for r in recs}
    assert len(texts) == sum(len(recs) for recs in splits.values())


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_most_problems_have_several_solutions(splits, split):
    counts = [len(r["verifier"]["solutions"]) for r in splits[split]]
    assert sum(c >= 2 for c in counts) / len(counts) >= 0.7


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown split"):
        cd.generate("dev", 3, seed=0)
    with pytest.raises(ValueError):
        cd.generate("train", -1, seed=0)
    assert cd.generate("test", 0, seed=0) == []


def test_round_trip_through_jsonl(tmp_path, splits):
    path = tmp_path / "train.jsonl"
    write_jsonl(path, splits["train"])
    assert list(read_jsonl(path)) == splits["train"]


# ------------------------------------------------------------------ grading


def test_every_solution_and_sample_checks(splits):
    rng = random.Random(0)
    for recs in splits.values():
        for r in recs[:150]:
            for sol in r["verifier"]["solutions"]:
                assert cd.check(sol, r) == (True, sol)
            for _ in range(2):
                answer = cd.sample_solution(r, rng)
                ok, canon = cd.check(answer, r)
                assert ok and canon in r["verifier"]["solutions"], (r, answer)


def test_sample_solution_covers_modes_and_orders():
    r = _record([3, 12, 5, 20], 15)
    assert r["verifier"]["solutions"] == ["20-5", "3*5", "3+12"]
    rng = random.Random(1)
    seen = Counter(cd.sample_solution(r, rng) for _ in range(400))
    assert set(seen) == {"20-5", "3*5", "5*3", "3+12", "12+3"}


def test_examples():
    r = _record([3, 7, 12, 5], 15)
    assert cd.check("12+3", r) == (True, "3+12")
    assert cd.check(" 3 * 5 = 15\nbecause", r) == (True, "3*5")
    assert cd.check("3+12\n", r) == (True, "3+12")
    assert cd.check("7+7", r) == (False, None)  # only one 7
    assert cd.check("7+8", r) == (False, None)  # 8 is not given
    assert cd.check("12+5", r) == (False, None)  # wrong value
    assert cd.check("12-3", r) == (False, None)
    assert cd.check("5*3", _record([5, 3, 5], 15)) == (True, "3*5")
    assert cd.check("5+5", _record([5, 3, 5], 10)) == (True, "5+5")
    assert cd.check("5+5", _record([5, 3, 6], 10)) == (False, None)  # reused number
    # no verifier: the numbers come from the problem text
    assert cd.check("12+3", {"id": "y", "problem": "3 7 12 5 -> 15", "answer": "15", "source": "t"}) == (True, "3+12")


@pytest.mark.parametrize(
    "response",
    [
        "",
        " ",
        "15",
        "12+",
        "+12",
        "-3+18",
        "12+3+0",
        "(12+3)",
        "12 + 3 apples",
        "12/3",
        "12^3",
        "12 3",
        "12+3.0",
        "012+3",
        "12++3",
        "12+-3",
        "twelve+3",
        "１２+3",
        "\n12+3",
        "12\n+3",
        "1e1+5",
    ],
)
def test_malformed_rejected(response):
    r = _record([3, 7, 12, 5, 4, 0], 15)
    assert cd.check(response, r) == (False, None)


def test_parse_expression():
    assert cd.parse_expression("12+3") == (12, "+", 3)
    assert cd.parse_expression("\t12  -  3 \r\nmore") == (12, "-", 3)
    assert cd.parse_expression("4*5=20") == (4, "*", 5)
    assert cd.parse_expression("0*5") == (0, "*", 5)
    assert cd.parse_expression("1234567+1") is None  # longer than MAX_DIGITS
    assert cd.parse_expression(None) is None


@pytest.mark.parametrize(
    "response",
    [
        "1" * 100_000,
        " " * 100_000 + "12+3x",
        "1+" + "2" * 100_000,
        "(" * 100_000,
        "12+3" + "x" * 100_000,
        "9" * 5000 + "+3",
        "12+3" + " " * 100_000 + "+",
        "+" * 100_000,
        "1+2" * 33_000,
    ],
)
def test_huge_inputs_rejected_quickly(response):
    r = _record([3, 7, 12, 5], 15)
    start = time.perf_counter()
    assert cd.check(response, r) == (False, None)
    assert time.perf_counter() - start < 0.5


def test_trailing_spaces_are_fine():
    assert cd.check("12+3" + " " * 100_000, _record([3, 7, 12, 5], 15)) == (True, "3+12")


def test_check_is_picklable():
    assert pickle.loads(pickle.dumps(cd.check)) is cd.check


def test_check_in_worker_processes_and_threads(splits):
    recs = splits["test"][:12]
    responses = [r["verifier"]["solutions"][0] for r in recs] + ["1+1"] * len(recs)
    expected = [(True, r["verifier"]["solutions"][0]) for r in recs] + [cd.check("1+1", r) for r in recs]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert list(pool.map(cd.check, responses, recs + recs)) == expected
    # math-verify's signal-based timeouts only work in the main thread; check turns them off elsewhere
    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(cd.check, responses, recs + recs)) == expected


numbers_st = st.lists(st.integers(1, 30), min_size=2, max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(numbers=numbers_st, data=st.data())
def test_check_agrees_with_brute_force(numbers, data):
    a = data.draw(st.one_of(st.sampled_from(numbers), st.integers(0, 40)))
    b = data.draw(st.one_of(st.sampled_from(numbers), st.integers(0, 40)))
    op = data.draw(st.sampled_from(cd.OPS))
    target = data.draw(st.one_of(st.just(cd.evaluate(a, op, b)), st.integers(-40, 900)))
    spaces = data.draw(st.sampled_from(["", " ", "  "]))
    response = f"{a}{spaces}{op}{spaces}{b}" + data.draw(st.sampled_from(["", "\n", "=", " = x"]))
    have = Counter(numbers)
    available = have[a] >= 1 and have[b] >= 1 and (a != b or have[a] >= 2)
    expected = available and cd.evaluate(a, op, b) == target
    ok, canon = cd.check(response, _record(numbers, target))
    assert ok == expected
    if ok:
        assert canon == cd.canonical(a, op, b) and canon in cd.solutions(numbers, target)
    else:
        assert canon is None


@settings(max_examples=300, deadline=None)
@given(numbers=numbers_st, target=st.integers(-40, 900))
def test_solutions_brute_force(numbers, target):
    expected = set()
    for i in range(len(numbers)):
        for j in range(len(numbers)):
            for op in cd.OPS:
                if i != j and cd.evaluate(numbers[i], op, numbers[j]) == target:
                    expected.add(cd.canonical(numbers[i], op, numbers[j]))
    assert cd.solutions(numbers, target) == sorted(expected)


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("0123456789+-*= \t\n\rx(")), max_size=30))
def test_parse_expression_never_crashes(text):
    parsed = cd.parse_expression(text)
    if parsed is not None:
        a, op, b = parsed
        assert op in cd.OPS and 0 <= a < 10**cd.MAX_DIGITS and 0 <= b < 10**cd.MAX_DIGITS
        assert f"{a}{op}{b}" in text.replace(" ", "").replace("\t", "")


def test_cached_comparison_is_math_verifys_verdict():
    """The grader's cached parse + verify gives math-verify's own verdict on fresh parses, pair by pair (repeated
    pairs, in both orders, hit the caches)."""
    import math_verify

    rng = random.Random(7)
    pairs = [
        (str(rng.randint(1, 60)), f"{rng.randint(1, 30)}{rng.choice('+-*')}{rng.randint(1, 30)}") for _ in range(300)
    ]
    pairs += pairs[::-1] + [("15", "3*5"), ("15", "20-5"), ("-3", "2-5"), ("0", "4-4")]
    for gold, expression in pairs:
        expected = bool(math_verify.verify(math_verify.parse(gold), math_verify.parse(expression)))
        assert cd._math_verify_equal(gold, expression) == expected, (gold, expression)
    assert cd._parse.cache_info().hits > 0 and cd._math_verify_equal.cache_info().hits > 0
