"""OpenRLHF's custom reward file (``--reward.remote_url <this file>``): binary math-verify correctness.

OpenRLHF 0.11.2 loads a ``--reward.remote_url`` ending in ``.py`` with ``spec_from_file_location`` and calls
its ``reward_func(queries, prompts, labels)`` (``openrlhf/utils/agent.py`` L196-205), from the vLLM rollout
actor, once per sample (lists of length 1, L290 and L308-325), in a worker thread
(``asyncio.to_thread``). ``queries`` are ``prompt + response`` decoded with the special tokens kept
(L288); ``labels`` are the dataset's ``--data.label_key`` field. It returns ``{"rewards", "scores",
"extra_logs"}``: ``rewards`` feed the advantages, ``scores`` the dynamic filtering (L295-302,
samples_generator.py L169-177), and ``extra_logs`` are logged per sample.

The reward is 1.0 when ``calibrl.grading.grade_one(response, gold)`` says correct, else 0.0, as in the CPU
trainer. Threads cannot use math-verify's ``signal.alarm`` timeouts, so by default the grades are done by a
``calibrl.grading.Grader`` process pool (``grade_one`` in worker processes, whose main threads have the
timeouts; a hung worker is killed and the item counts as wrong), shared by the actor's threads. The
threads do not queue behind one another: whatever samples arrive while a batch is being graded are
graded together as the next batch, so all the pool's workers stay busy. ``CALIBRL_REWARD_WORKERS``
sets the pool size (default 2; 0 grades in the calling thread, without timeouts) and
``CALIBRL_REWARD_TIMEOUT`` math-verify's per-call timeout in seconds (default 5).
"""

from __future__ import annotations

import os
import re
import threading
from concurrent.futures import Future

import torch

from calibrl.grading import Grade, Grader, grade_one

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
    workers = int(os.environ.get("CALIBRL_REWARD_WORKERS", "2"))
    timeout = float(os.environ.get("CALIBRL_REWARD_TIMEOUT", "5"))
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
    """Binary rewards (1.0 correct, 0.0 otherwise) for ``queries``, aligned with them."""
    if not len(queries) == len(prompts) == len(labels):
        raise ValueError(f"{len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels")
    grades = _grade([(response_text(q, p), str(gold)) for q, p, gold in zip(queries, prompts, labels)])
    rewards = torch.tensor([1.0 if g.correct else 0.0 for g in grades], dtype=torch.float32)
    found = torch.tensor([0.0 if g.extracted is None else 1.0 for g in grades], dtype=torch.float32)
    timed_out = torch.tensor([1.0 if g.timed_out else 0.0 for g in grades], dtype=torch.float32)
    return {
        "rewards": rewards,
        "scores": rewards.clone(),
        "extra_logs": {"answer_found": found, "grade_timeout": timed_out},
    }
