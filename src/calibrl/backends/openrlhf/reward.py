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

Threads cannot use math-verify's ``signal.alarm`` timeouts, so the grades are done by a
``calibrl.grading.Grader`` process pool (``grade_one`` in worker processes, whose main threads have the
timeouts; a hung worker is killed and the item counts as wrong), shared by the actor's threads. The
threads do not queue behind one another: whatever samples arrive while a batch is being graded are
graded together as the next batch, so all the pool's workers stay busy. ``CALIBRL_REWARD_WORKERS`` is the
pool size, ``grid.workers`` (the training job sets it, ``OpenRLHFBackend.train``, and the launcher passes it to
every Ray worker; 0 grades in the calling thread, without timeouts); each vLLM engine's rollout actor has a pool
of its own. ``CALIBRL_REWARD_TIMEOUT`` is math-verify's per-call timeout in seconds (default 5). The file refuses
to load, failing the engine's start, without either variable it needs.
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

import torch

from calibrl.algo.dapo import outcome_reward
from calibrl.grading import Grade, Grader, grade_one

SETTINGS_ENV = "CALIBRL_SETTINGS"  # calibrl.backends.openrlhf.hook.ENV (not imported: it loads every patch module)
WORKERS_ENV = "CALIBRL_REWARD_WORKERS"
TIMEOUT_ENV = "CALIBRL_REWARD_TIMEOUT"


class RunReward(NamedTuple):
    """What the reward file needs of its run: the reward scale of its method and the grading pool's size. (Not a
    dataclass: OpenRLHF loads this file without a ``sys.modules`` entry, which dataclasses look up.)"""

    reward: str  # calibrl.spec.MethodSpec.reward: "binary" or "signed" (DAPO)
    workers: int  # grid.workers
    timeout: float


def run_reward(environ=os.environ) -> RunReward:
    """The run's :class:`RunReward`, from its settings.json (``CALIBRL_SETTINGS``) and ``CALIBRL_REWARD_WORKERS``;
    raises, naming what is missing, rather than grading on a guess."""
    from calibrl.spec import MethodSpec

    path, workers = environ.get(SETTINGS_ENV), environ.get(WORKERS_ENV)
    if not path:
        raise RuntimeError(
            f"{SETTINGS_ENV} is not set: the reward file reads the run's method (its reward scale) from the run's "
            "settings.json, which calibrl.backends.openrlhf.launch passes to every Ray worker"
        )
    if workers is None or not workers.strip().isdigit():
        raise RuntimeError(
            f"{WORKERS_ENV}={workers!r}: the reward file's grading pool needs the run's grid.workers (an integer "
            ">= 0), which the training job sets (calibrl.backends.openrlhf.OpenRLHFBackend.train)"
        )
    spec = MethodSpec.from_dict(json.loads(Path(path).read_text())["settings"]["method"])
    return RunReward(spec.reward, int(workers), float(environ.get(TIMEOUT_ENV, "5")))


RUN = run_reward()  # when OpenRLHF loads the file, in each rollout actor: a missing variable fails the start

_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>")  # <|im_end|>, <|endoftext|>, ...
_lock = threading.Lock()  # guards _grader, _pending and _grading
_grader: Grader | None = None
_pending: list[tuple[tuple[str, str], Future]] = []  # samples waiting for the next batch
_grading = False  # a thread is grading a batch


def response_text(query: str, prompt: str) -> str:
    """The model's response in ``query``: what follows the prompt, without special tokens.

    ``query`` is normally ``prompt + response``; if the prompt was cut (too long) or decodes differently,
    the text after its last occurrence is used, else the whole query (the grader reads the last answer,
    which is the response's).
    """
    if query.startswith(prompt):
        response = query[len(prompt) :]
    else:
        at = query.rfind(prompt) if prompt else -1
        response = query[at + len(prompt) :] if at >= 0 else query
    return _SPECIAL.sub("", response)


def _grade(pairs: list[tuple[str, str]]) -> list[Grade]:
    global _grader, _grading
    workers, timeout = RUN.workers, RUN.timeout
    if workers <= 0:
        return [grade_one(response, gold, timeout) for response, gold in pairs]
    mine = [Future() for _ in pairs]
    with _lock:
        if _grader is None:
            _grader = Grader(workers=workers, timeout=timeout)
        _pending.extend(zip(pairs, mine))
        if _grading:  # the grading thread takes these samples with its next batch
            lead = False
        else:
            lead = _grading = True
    if lead:  # grade batches until none is waiting
        while True:
            with _lock:
                batch = _pending[:]
                _pending.clear()
                if not batch:
                    _grading = False
                    break
            try:  # a Grader is used by one thread at a time
                for (_, fut), grade in zip(batch, _grader.grade([pair for pair, _ in batch])):
                    fut.set_result(grade)
            except BaseException as exc:  # every waiting thread hears of it, then the next batch is tried
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
    return [fut.result() for fut in mine]


def reward_func(queries: list[str], prompts: list[str], labels: list[str], **kwargs) -> dict:
    """Rewards for ``queries``, aligned with them, on the run's scale (1 / 0, DAPO +1 / -1), and their 0/1
    correctness as ``scores``."""
    if not len(queries) == len(prompts) == len(labels):
        raise ValueError(f"{len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels")
    grades = _grade([(response_text(q, p), str(gold)) for q, p, gold in zip(queries, prompts, labels)])
    correct = torch.tensor([g.correct for g in grades], dtype=torch.bool)
    found = torch.tensor([0.0 if g.extracted is None else 1.0 for g in grades], dtype=torch.float32)
    timed_out = torch.tensor([1.0 if g.timed_out else 0.0 for g in grades], dtype=torch.float32)
    return {
        "rewards": outcome_reward(correct, RUN.reward),
        "scores": correct.float(),
        "extra_logs": {"answer_found": found, "grade_timeout": timed_out},
    }
