"""Grading throughput: calibrl.grading.Grader against a plain sequential math-verify loop.

    .venv/bin/python benchmarks/grading_throughput.py [--problems 300] [--workers 2] [--quick]

Builds realistic evaluation output from the real benchmark answers in ../shared/data/benchmarks (MATH-500,
GSM8K, Minerva, OlympiadBench, AIME24, AMC23, MATH lighteval): n = 8 samples per problem, each a short
worked answer ending in ``\\boxed{...}`` whose final answer is drawn from a sharpened per-problem
distribution (the gold answer written one of several ways 50%, three wrong answers 30/15/5%), so final
answers repeat within a problem as they do for an RL-trained policy; the repetition rate is measured and
printed. A few pathological responses (a tower of powers, 300 nested fractions, a 20,000-character
response, an unclosed box) are mixed in.

Baseline: ``math_verify.verify(parse(gold_latex(gold)), parse(response))`` per item in one process, no cache
of ours (math-verify defaults; the Grader's verdicts are defined as these). Candidate:
``Grader(workers).grade(pairs)`` from a cold start (worker start-up included): a process pool, a cache on the
exact (response, gold) pair, and in the workers caches keyed on what math-verify compares. Prints the
speed-up, the agreement of the two verdicts (must be 100%), and how many items the Grader reported as
timed out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from _common import SHARED_DATA, machine, ratio_line

FILES = (
    "math500.jsonl",
    "gsm8k_test.jsonl",
    "minerva_math.jsonl",
    "olympiadbench.jsonl",
    "aime24.jsonl",
    "amc23.jsonl",
    "math_lighteval_test.jsonl",
)
N_SAMPLES = 8
SOLUTION_FILES = ("math500.jsonl", "aime24.jsonl", "minerva_math.jsonl")
PATHOLOGICAL = (  # the cheap ones first, so that --quick stays quick
    "therefore \\boxed{\\sqrt{2} + \\int_0^1 x\\,dx",
    "step " * 4000 + "so the answer is \\boxed{7}",
    "we get \\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 600 + "}",
    "so the value is \\boxed{9^{9^{9^{9^{9^{9}}}}}}",
)


def load_golds(data_dir, problems: int, rng: random.Random) -> list[str]:
    """``problems`` gold answers, an equal share from each benchmark file, in a fixed random order."""
    per_file = max(1, problems // len(FILES))
    golds: list[str] = []
    for name in FILES:
        path = data_dir / name
        if not path.is_file():
            sys.exit(f"grading_throughput: {path} is missing (the real benchmark copies; see --data)")
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        answers = [str(r["answer"]).strip() for r in rows if str(r.get("answer", "")).strip()]
        golds += rng.sample(answers, min(per_file, len(answers)))
    rng.shuffle(golds)
    return golds[:problems]


def variants(gold: str) -> list[str]:
    """Ways a model writes the gold answer (equal after math-verify, different strings)."""
    out = [gold, f" {gold} "]
    if gold.lstrip("-").isdigit():
        out += [f"{gold}.0", f"{int(gold):,}" if abs(int(gold)) >= 1000 else f"{gold}.00"]
    return out


def wrong_answers(gold: str, pool: list[str], rng: random.Random) -> list[str]:
    if gold.lstrip("-").isdigit():
        g = int(gold)
        return [str(g + 1), str(g * 2 + 3), str(-g - 7)]
    return rng.sample(pool, 3)


def solution_corpus(data_dir) -> str:
    """Real worked solutions (MATH-500, AIME24, Minerva), boxes removed, as one LaTeX-rich text to cut
    reasoning of a realistic length from."""
    texts = []
    for name in SOLUTION_FILES:
        for line in (data_dir / name).read_text(encoding="utf-8").splitlines():
            if line.strip() and (sol := json.loads(line).get("solution")):
                texts.append(sol.replace("\\boxed", "").replace("\\fbox", ""))
    return "\n\n".join(texts)


def working(rng: random.Random, corpus: str, chars: int) -> str:
    """The reasoning before the final answer: a few short steps, or (``chars`` > 0) a cut of the real
    solutions of about ``chars`` characters (0.5-1.5x), starting and ending at a line break."""
    if chars <= 0:
        steps = rng.randint(1, 4)
        return " ".join(f"Step {i}: we simplify the expression {rng.randint(2, 99)}." for i in range(steps))
    size = rng.randint(chars // 2, 3 * chars // 2)
    start = corpus.find("\n", rng.randrange(max(1, len(corpus) - size))) + 1
    end = corpus.rfind("\n", start, start + size)
    return corpus[start : end if end > start else start + size]


def build_items(
    golds: list[str], rng: random.Random, pathological: int, corpus: str = "", chars: int = 0
) -> list[tuple[str, str]]:
    """(response, gold) pairs: N_SAMPLES per problem, and ``pathological`` adversarial items among them."""
    items = []
    for gold in golds:
        right, wrong = variants(gold), wrong_answers(gold, golds, rng)
        for _ in range(N_SAMPLES):
            u = rng.random()
            final = rng.choice(right) if u < 0.5 else wrong[0] if u < 0.8 else wrong[1] if u < 0.95 else wrong[2]
            work = working(rng, corpus, chars)
            items.append((f"{work} Therefore the final answer is $\\boxed{{{final}}}$.", gold))
    for i in range(pathological):
        # at random places, as in real output (and not all in one worker's chunk)
        items.insert(rng.randrange(len(items) + 1), (PATHOLOGICAL[i % len(PATHOLOGICAL)], golds[i % len(golds)]))
    return items


def baseline(items: list[tuple[str, str]]) -> tuple[list[bool], list[float]]:
    """The plain loop: parse gold, parse response, verify; math-verify's own defaults and extraction.
    Returns the verdicts and each item's time."""
    import math_verify

    from calibrl.grading import gold_latex

    verdicts, seconds = [], []
    for response, gold in items:
        t0 = time.perf_counter()
        try:
            ok = bool(math_verify.verify(math_verify.parse(gold_latex(gold)), math_verify.parse(response)))
        except Exception:
            ok = False
        seconds.append(time.perf_counter() - t0)
        verdicts.append(ok)
    return verdicts, seconds


def _plain_chunk(pairs: list[tuple[str, str]]) -> None:
    """The baseline's own loop on a chunk, in a worker process (stock math-verify, nothing of the Grader)."""
    import math_verify

    from calibrl.grading import gold_latex

    for response, gold in pairs:
        try:
            math_verify.verify(math_verify.parse(gold_latex(gold)), math_verify.parse(response))
        except Exception:
            pass


def _warm_up() -> None:
    import math_verify

    math_verify.verify(math_verify.parse("$1$"), math_verify.parse("\\boxed{1}"))
    time.sleep(0.2)


def math_verify_wall(pairs: list[tuple[str, str]], workers: int) -> float:
    """Wall seconds for ``workers`` warm processes to run the baseline's loop over ``pairs`` in balanced
    chunks of 16 (the Grader's chunk size): math-verify's work on the distinct pairs at this machine's real
    parallel speed, with nothing of the Grader's caches."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as ex:
        for f in [ex.submit(_warm_up) for _ in range(workers)]:  # every worker started and warm
            f.result()
        share = 16
        t0 = time.perf_counter()
        for f in [ex.submit(_plain_chunk, pairs[i : i + share]) for i in range(0, len(pairs), share)]:
            f.result()
        return time.perf_counter() - t0


def ceilings(items, seconds, odd: set[str], workers: int) -> dict[str, float]:
    """What a grader that is math-verify plus a cache and a pool (and nothing else) could reach against this
    baseline: a free cache on the exact (response, gold) pair, free start-up, and ``workers`` processes
    running math-verify on each distinct pair, timed here in warm processes. A pathological item costs its
    timeout on both sides. (The Grader may pass it: its workers also cache inside math-verify's work.)

    Also splits the baseline's own time by kind of item: repeats cost it little, because math-verify and
    sympy cache too."""
    seen: set[tuple[str, str]] = set()
    t = {"repeat": 0.0, "first_integer": 0.0, "first_other": 0.0, "pathological": 0.0}
    n = dict.fromkeys(t, 0)
    distinct = []
    for (response, gold), sec in zip(items, seconds):
        if response in odd:
            kind = "pathological"
        elif (response, gold) in seen:
            kind = "repeat"
        else:  # split by the gold: an integer gold is where the Grader's two-integer verdict can apply
            kind = "first_integer" if gold.strip().lstrip("-").isdigit() else "first_other"
            distinct.append((response, gold))
        seen.add((response, gold))
        t[kind] += sec
        n[kind] += 1
    t_math_verify = math_verify_wall(distinct, workers) if distinct else 0.0
    base_all, base_ordinary = sum(seconds), sum(t.values()) - t["pathological"]
    return {
        **{f"t_{k}": v for k, v in t.items()},
        **{f"n_{k}": v for k, v in n.items()},
        "t_math_verify": t_math_verify,
        "t_ordinary": base_ordinary,
        "ordinary": base_ordinary / max(t_math_verify, 1e-9),
        "all": base_all / max(max(seconds), t_math_verify + t["pathological"] / workers, 1e-9),
    }


def grade_cold(items: list[tuple[str, str]], workers: int, timeout: float):
    """A fresh Grader (worker start-up included): (seconds, grades, stats)."""
    from calibrl.grading import Grader

    t0 = time.perf_counter()
    with Grader(workers=workers, timeout=timeout) as grader:
        grades = grader.grade(items)
        stats = dict(grader.stats)
    return time.perf_counter() - t0, grades, stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=300, help="problems (x 8 samples each)")
    parser.add_argument("--pathological", type=int, default=4, help="adversarial items mixed in")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0, help="Grader per-call timeout (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=lambda s: __import__("pathlib").Path(s), default=SHARED_DATA / "benchmarks")
    parser.add_argument(
        "--response-chars",
        type=int,
        default=0,
        help="0: short responses (a few steps, then the boxed answer); N: reasoning of about N characters "
        "cut from the real MATH-500/AIME24/Minerva solutions before the boxed answer (8192 tokens, the "
        "paper config's limit, are about 24,000 characters)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny size, for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.problems, args.pathological = 14, 1

    rng = random.Random(args.seed)
    corpus = solution_corpus(args.data) if args.response_chars > 0 else ""
    items = build_items(load_golds(args.data, args.problems, rng), rng, args.pathological, corpus, args.response_chars)
    odd = set(PATHOLOGICAL)
    ordinary = [it for it in items if it[0] not in odd]
    distinct = len(set(items))
    repetition = 1 - distinct / len(items)
    # the final answers repeat within a problem (the boxed answer the generator wrote), the texts hardly
    finals = len({(r.rsplit("\\boxed{", 1)[-1], g) for r, g in items})

    t_grader, grades, stats = grade_cold(items, args.workers, args.timeout)
    t_ordinary, _, _ = grade_cold(ordinary, args.workers, args.timeout)
    t0 = time.perf_counter()
    base, seconds = baseline(items)
    t_base = time.perf_counter() - t0

    bound = ceilings(items, seconds, odd, args.workers)
    t_base_ordinary = bound["t_ordinary"]
    agree = sum(g.correct == b for g, b in zip(grades, base)) / len(items)
    print(f"machine: {machine()}")
    print(
        f"items: {len(items)} ({len(ordinary)} from {args.problems} problems x {N_SAMPLES} samples + "
        f"{len(items) - len(ordinary)} pathological), median response "
        f"{sorted(len(r) for r, _ in ordinary)[len(ordinary) // 2]} characters; "
        f"distinct (response, gold) pairs {distinct} (repetition rate {repetition:.1%}), "
        f"distinct (final answer, gold) pairs {finals} (repetition rate {1 - finals / len(items):.1%})"
    )
    print(
        f"baseline sequential math-verify loop: {t_base:.2f} s ({len(items) / t_base:.0f} items/s), "
        f"slowest item {max(seconds):.2f} s, pathological items {bound['t_pathological']:.2f} s in all"
    )
    print(
        f"Grader({args.workers} workers, cache): {t_grader:.2f} s ({len(items) / t_grader:.0f} items/s) incl. worker "
        f"start-up; cache hits {stats['cache_hits']}, timed out {stats['timeouts']} (each stopped at its "
        f"{args.timeout:g} s timeout), errors {stats['errors']}"
    )
    print(f"verdict agreement with the baseline: {agree:.1%}")
    print(ratio_line("grading throughput (Grader / sequential loop)", t_base / t_grader, "target >= 10x on 2 cores"))
    print(
        ratio_line(
            "grading throughput, ordinary items only",
            t_base_ordinary / t_ordinary,
            f"baseline {t_base_ordinary:.2f} s, Grader {t_ordinary:.2f} s",
        )
    )
    print(
        "baseline per item: "
        f"repeated pairs {bound['n_repeat']} in {bound['t_repeat']:.2f} s, "
        f"first integer-gold pairs {bound['n_first_integer']} in {bound['t_first_integer']:.2f} s, "
        f"other first pairs {bound['n_first_other']} in {bound['t_first_other']:.2f} s "
        f"({1000 * bound['t_first_other'] / max(bound['n_first_other'], 1):.2f} ms each), "
        f"pathological {bound['n_pathological']} in {bound['t_pathological']:.2f} s; math-verify alone on the "
        f"{bound['n_first_integer'] + bound['n_first_other']} distinct pairs, {args.workers} warm processes: "
        f"{bound['t_math_verify']:.2f} s"
    )
    print(
        ratio_line(
            "ceiling of any cache + pool grader on this workload",
            bound["all"],
            f"{args.workers} workers running math-verify once per distinct (response, gold) pair, "
            f"everything else free; ordinary items only {bound['ordinary']:.2f}x",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
