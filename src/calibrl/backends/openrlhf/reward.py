"""OpenRLHF's custom reward file (``--reward.remote_url <this file>``): math-verify correctness, on the run's scale.

OpenRLHF 0.11.2 loads a ``--reward.remote_url`` ending in ``.py`` with ``spec_from_file_location`` and calls
its ``reward_func(queries, prompts, labels)`` (``openrlhf/utils/agent.py`` L196-205), from the vLLM rollout
actor, once per sample (lists of length 1, L290 and L308-325), in a worker thread
(``asyncio.to_thread``). ``queries`` are ``prompt + response`` decoded with the special tokens kept
(L288); ``labels`` are the dataset's ``--data.label_key`` field. It returns ``{"rewards", "scores",
"extra_logs"}``: ``rewards`` feed the advantages, ``scores`` the dynamic filtering (L295-302,
samples_generator.py L169-177), and ``extra_logs`` are logged per sample.

What it returns follows the run's compiled method (``calibrl.spec.MethodSpec.reward``), read when the file is
loaded from the run's ``settings.json`` (``CALIBRL_SETTINGS``, the launcher's one variable): ``rewards`` are
``calibrl.algo.dapo.outcome_reward`` of the correctness, 1 / 0 for GRPO and the other baselines, +1 / -1 for the DAPO
methods (verl's ``math_dapo.compute_score``; OpenRLHF then adds the overlong penalty to ``rewards``,
``--reward.overlong_buffer_len``); ``scores`` are always the 0/1 correctness, which OpenRLHF's dynamic filter keeps
groups by (``--algo.dynamic_filtering_range 0 1``, verl's ``filter_groups.metric: acc``) and the IAC patch counts
successes by (``calibrl.backends.openrlhf.iac``). Correctness is ``calibrl.grading.grade_one(response, gold)``, as
in the CPU trainer.

The grading is the GPU backends' shared one (``calibrl.gpu.reward``): a batching grader with a process pool of
``grid.workers`` (``CALIBRL_REWARD_WORKERS``: the training job sets it, ``OpenRLHFBackend.train``, and the launcher
passes it to every Ray worker), one per vLLM engine's rollout actor, shared by its threads. The file refuses to
load, failing the engine's start, without a variable it needs.
"""

from __future__ import annotations

from calibrl.gpu.reward import BatchGrader, RunReward, response_text, rewards, run_reward

__all__ = ["RunReward", "response_text", "reward_func"]

RUN = run_reward()  # when OpenRLHF loads the file, in each rollout actor: a missing variable fails the start
GRADER = BatchGrader(RUN.workers, RUN.timeout)


def reward_func(queries: list[str], prompts: list[str], labels: list[str], **kwargs) -> dict:
    """Rewards for ``queries``, aligned with them, on the run's scale (1 / 0, DAPO +1 / -1), and their 0/1
    correctness as ``scores``."""
    if not len(queries) == len(prompts) == len(labels):
        raise ValueError(f"{len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels")
    out = rewards(GRADER.grade([(response_text(q, p), str(gold)) for q, p, gold in zip(queries, prompts, labels)]),
                  RUN.reward)  # fmt: skip
    extra = {"answer_found": out.pop("answer_found"), "grade_timeout": out.pop("grade_timeout")}
    return {**out, "extra_logs": extra}
