"""A rollout's reward, shared by the GPU backends: math-verify correctness of a response (``calibrl.grading``), on
the scale of the run's compiled method, graded in batches by a pool shared by a process's threads.

``run_reward`` reads what grading needs of a run: its method's reward scale (``calibrl.spec.MethodSpec.reward``, from
the run's ``settings.json``, ``CALIBRL_SETTINGS``, read as a ``calibrl.checkpoints.RunStamp``), the pool's size
(``CALIBRL_REWARD_WORKERS``, the run's ``grid.workers``) and math-verify's per-call timeout in seconds
(``CALIBRL_REWARD_TIMEOUT``, default 5); it raises, naming what is missing, rather than grading on a guess.

Threads cannot use math-verify's ``signal.alarm`` timeouts, so a :class:`BatchGrader` grades in a
``calibrl.grading.Grader`` process pool (``grade_one`` in worker processes, whose main threads have the timeouts; a
hung worker is killed and the item counts as wrong), shared by the calling threads. The threads do not queue behind
one another: whatever samples arrive while a batch is being graded are graded together as the next batch, so all
the pool's workers stay busy. With 0 workers it grades in the calling thread, without timeouts.
"""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import Future
from typing import NamedTuple

import torch

from calibrl.algo.dapo import outcome_reward
from calibrl.checkpoints import SETTINGS_ENV, RunStamp
from calibrl.grading import Grade, Grader, grade_one

WORKERS_ENV = "CALIBRL_REWARD_WORKERS"
TIMEOUT_ENV = "CALIBRL_REWARD_TIMEOUT"


class RunReward(NamedTuple):
    """What grading needs of a run: the reward scale of its method, the grading pool's size and the timeout."""

    reward: str  # calibrl.spec.MethodSpec.reward: "binary" or "signed" (DAPO)
    workers: int  # grid.workers
    timeout: float


def run_reward(environ=os.environ) -> RunReward:
    """The run's :class:`RunReward`, from its settings.json (``CALIBRL_SETTINGS``) and ``CALIBRL_REWARD_WORKERS``;
    raises, naming what is missing, rather than grading on a guess."""
    path, workers = environ.get(SETTINGS_ENV), environ.get(WORKERS_ENV)
    if not path:
        raise RuntimeError(
            f"{SETTINGS_ENV} is not set: the reward reads the run's method (its reward scale) from the run's "
            "settings.json, which the backend's launcher passes to every Ray worker"
        )
    if workers is None or not workers.strip().isdigit():
        raise RuntimeError(
            f"{WORKERS_ENV}={workers!r}: the reward's grading pool needs the run's grid.workers (an integer "
            ">= 0), which the backend's training job sets"
        )
    return RunReward(RunStamp.read(path).method.reward, int(workers), float(environ.get(TIMEOUT_ENV, "5")))


_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>")  # <|im_end|>, <|endoftext|>, ...


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


class BatchGrader:
    """Grades (response, gold) pairs from many threads, batching what arrives while a batch is graded."""

    def __init__(self, workers: int, timeout: float):
        self.workers, self.timeout = int(workers), float(timeout)
        self._lock = threading.Lock()  # guards _grader, _pending and _grading
        self._grader: Grader | None = None
        self._pending: list[tuple[tuple[str, str], Future]] = []  # samples waiting for the next batch
        self._grading = False  # a thread is grading a batch

    def grade(self, pairs: list[tuple[str, str]]) -> list[Grade]:
        if self.workers <= 0:
            return [grade_one(response, gold, self.timeout) for response, gold in pairs]
        mine = [Future() for _ in pairs]
        with self._lock:
            if self._grader is None:
                self._grader = Grader(workers=self.workers, timeout=self.timeout)
            self._pending.extend(zip(pairs, mine))
            if self._grading:  # the grading thread takes these samples with its next batch
                lead = False
            else:
                lead = self._grading = True
        if lead:  # grade batches until none is waiting
            while True:
                with self._lock:
                    batch = self._pending[:]
                    self._pending.clear()
                    if not batch:
                        self._grading = False
                        break
                try:  # a Grader is used by one thread at a time
                    for (_, fut), grade in zip(batch, self._grader.grade([pair for pair, _ in batch])):
                        fut.set_result(grade)
                except BaseException as exc:  # every waiting thread hears of it, then the next batch is tried
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
        return [fut.result() for fut in mine]


def rewards(grades: list[Grade], scale: str) -> dict[str, torch.Tensor]:
    """``rewards`` on the run's scale (``calibrl.algo.dapo.outcome_reward``: 1 / 0, DAPO +1 / -1), ``scores`` the
    0/1 correctness, and per sample whether an answer was found and whether grading timed out."""
    correct = torch.tensor([g.correct for g in grades], dtype=torch.bool)
    return {
        "rewards": outcome_reward(correct, scale),
        "scores": correct.float(),
        "answer_found": torch.tensor([0.0 if g.extracted is None else 1.0 for g in grades], dtype=torch.float32),
        "grade_timeout": torch.tensor([1.0 if g.timed_out else 0.0 for g in grades], dtype=torch.float32),
    }
