"""verl's custom reward function (``reward.custom_reward_function.path=<this file>``, name ``compute_score``):
math-verify correctness on the run's scale.

verl 0.9.1's reward loop (``experimental/reward_loop/reward_manager``: ``naive``, DAPO's ``dapo``) loads this file in
each reward worker and calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` once per sample,
from executor threads, with the response decoded without special tokens. It returns a dict: ``score`` feeds the
advantages (the ``dapo`` manager adds the overlong penalty to it), every key goes into the batch's reward extra
info, where ``acc``, the 0/1 correctness, is what DAPO's group filter keeps groups by
(``algorithm.filter_groups.metric=acc``) and IAC counts successes by (``trainer``, ``advantage``).

``score`` is ``calibrl.algo.dapo.outcome_reward`` of the correctness: 1 / 0 for GRPO and the other baselines,
+1 / -1 for the DAPO methods (verl's ``math_dapo.compute_score``). The grading is the GPU backends' shared one
(``calibrl.gpu.reward``): the run's settings (``CALIBRL_SETTINGS``) and its pool's size (``CALIBRL_REWARD_WORKERS``),
which the launcher hands to every Ray worker; the file refuses to load without them.
"""

from __future__ import annotations

from calibrl.gpu.reward import BatchGrader, rewards, run_reward

RUN = run_reward()  # when verl loads the file, in each reward worker: a missing variable fails the start
GRADER = BatchGrader(RUN.workers, RUN.timeout)


def compute_score(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
    """The sample's reward on the run's scale (``score``), its 0/1 correctness (``acc``), whether an answer was
    found and whether grading timed out."""
    out = rewards(GRADER.grade([(solution_str, str(ground_truth))]), RUN.reward)
    return {
        "score": float(out["rewards"][0]),
        "acc": float(out["scores"][0]),
        "answer_found": float(out["answer_found"][0]),
        "grade_timeout": float(out["grade_timeout"][0]),
    }
