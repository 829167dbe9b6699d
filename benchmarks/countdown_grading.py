"""Countdown grading in the evaluating process against in a worker process, on an evaluation's responses.

    .venv/bin/python benchmarks/countdown_grading.py [--problems 400] [--samples 32] [--quick]

``calibrl.tasks.Scorer`` grades countdown answers in its own process (``Grader(workers=0)``): math-verify only ever
sees ``a op b`` over two of the problem's numbers, which cannot hang. The baseline is the same ``Grader`` with one
worker process, as every grader ran before (hang detection sends two messages per item). Verdicts must agree.

Responses are built, not sampled, to look like an evaluation's: per problem, ``--samples`` draws among a correct
answer (``countdown.sample_solution``, 40%), a wrong ``a op b`` over its own numbers (40%) and malformed text
(20%), so that many repeat, as a trained model's do. Each variant grades them batch by batch (64 problems), as
the evaluator does, with a cold cache; the in-process variant runs first, so it pays for math-verify's first
parses itself. Time is wall time, which for the in-process variant is also its core time.
"""

from __future__ import annotations

import argparse
import random
import sys

from _common import machine, ratio_line, timed


def responses(records: list[dict], samples: int, seed: int) -> list[str]:
    from calibrl.data import countdown

    rng = random.Random(seed)
    out = []
    for record in records:
        numbers = record["verifier"]["numbers"]
        for _ in range(samples):
            u = rng.random()
            if u < 0.4:
                out.append(countdown.sample_solution(record, rng))
            elif u < 0.8:
                out.append(f"{rng.choice(numbers)}{rng.choice('+-*')}{rng.choice(numbers)}")
            else:
                out.append(rng.choice(["", "1+", "3 7", "+2", "12+3+4"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=400, help="countdown test problems (grid: 400)")
    parser.add_argument("--samples", type=int, default=32, help="responses per problem (grid.eval.n)")
    parser.add_argument("--quick", action="store_true", help="32 problems x 8: for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.problems, args.samples = 32, 8

    from calibrl.data import countdown
    from calibrl.grading import Grader
    from calibrl.tasks import countdown_grade, gold_string

    records = countdown.generate("test", args.problems, seed=0)
    texts = responses(records, args.samples, seed=0)
    golds = [gold_string(r) for r in records for _ in range(args.samples)]
    per_batch = 64 * args.samples
    batches = [list(zip(texts[s : s + per_batch], golds[s : s + per_batch])) for s in range(0, len(texts), per_batch)]
    print(f"machine: {machine()}")
    print(f"{len(texts)} responses to {len(records)} problems, {len(set(zip(texts, golds)))} distinct pairs")

    def grade(workers: int):
        with Grader(workers=workers, timeout=5.0, check=countdown_grade) as grader:
            return [g.correct for batch in batches for g in grader.grade(batch)]

    t_here, here = timed(lambda: grade(0))
    t_pool, pool = timed(lambda: grade(1))
    if here != pool:
        print("the two variants gave different verdicts", file=sys.stderr)
        return 1
    print(f"in this process {t_here:.2f} s, one worker process {t_pool:.2f} s (its start included); "
          f"verdicts identical, {sum(here)} correct")  # fmt: skip
    print(ratio_line("countdown grading throughput, in process / one worker process", t_pool / t_here))
    return 0


if __name__ == "__main__":
    sys.exit(main())
