"""Grading math answers: math-verify's verdict, in worker processes that never hang, with caches.

- :mod:`calibrl.grading.answer`: what math-verify reads and compares (the gold's LaTeX, the extracted
  answer's text, exact comparison keys, the two-integer verdict);
- :mod:`calibrl.grading.verify`: math-verify on one pair (:func:`grade_one`), never raising;
- :mod:`calibrl.grading.pool`: the crash- and hang-safe worker pool with a cache (:class:`Grader`).

A verdict is ``math_verify.verify(math_verify.parse(gold_latex(gold)), math_verify.parse(response))``
with math-verify's defaults. There are no deliberate departures from it (tests/test_grader_differential.py
holds the Grader to that on 20,000 generated pairs and on hypothesis-built ones). What bounds the work,
never the rule, each a setting:

- ``timeout`` (default 5 s, math-verify's own default) is math-verify's per-call timeout; at another value
  the verdicts are math-verify's with that timeout;
- an item still running after ``6 x timeout + grace`` (two parses and four comparisons, each stopped at its
  timeout: only code where no alarm reaches, such as a huge power in C, gets there) is killed and counted
  as timed out and wrong, where math-verify would not return;
- workers have an address-space limit (``memory_limit_mb``, default 4096; None lifts it): an item that
  needs more counts as an error and wrong;
- graded in-process (``workers=0``) outside the main thread, math-verify runs without timeouts, as it
  requires there.

AVG@k / PASS@k are in :mod:`calibrl.metrics`.
"""

from calibrl.grading.answer import gold_latex
from calibrl.grading.pool import Grader, gold_problems
from calibrl.grading.verify import Grade, gold_check, grade_one

__all__ = ["Grade", "Grader", "gold_check", "gold_latex", "gold_problems", "grade_one"]
