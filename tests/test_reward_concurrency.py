"""The OpenRLHF reward function grades samples that arrive together in one batch (both pool workers busy),
rather than one sample at a time under a lock; and it grades through the same Grader as evaluation."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import calibrl
from calibrl.grading import Grader

REWARD = Path(calibrl.__file__).parent / "backends" / "openrlhf" / "reward.py"
PROMPT = "<|im_start|>user\nWhat is 6 x 7?<|im_end|>\n<|im_start|>assistant\n"


def _load_reward(monkeypatch, tmp_path: Path, workers: int):
    """The reward file as OpenRLHF loads it (a module of its own, from the file path), in a rollout actor of a paper
    GRPO run whose grid.workers is ``workers`` (the launcher's variables)."""
    from conftest import filled, paper_settings

    from calibrl import grid as G

    settings = paper_settings(filled("paper"), G.Run("qwen3-8b", "grpo", 0), tmp_path)
    monkeypatch.setenv("CALIBRL_SETTINGS", str(settings))
    monkeypatch.setenv("CALIBRL_REWARD_WORKERS", str(workers))
    spec = importlib.util.spec_from_file_location("reward_func_under_test", REWARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_concurrent_samples_are_graded_in_one_batch(monkeypatch, tmp_path):
    reward = _load_reward(monkeypatch, tmp_path, workers=2)
    n = 6
    batches: list[int] = []
    first_batch = threading.Event()

    class Recording(Grader):
        def grade(self, pairs):
            batches.append(len(pairs))
            if len(batches) == 1:  # hold the first batch until every other thread has handed in its sample
                first_batch.set()
                deadline = time.monotonic() + 120  # only a guard against a hang: the event is the trigger
                while len(reward.GRADER._pending) < n - 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
            return super().grade(pairs)

    reward.GRADER._grader = Recording(workers=2, timeout=5)
    cases = [(f"so \\boxed{{{42 + (i % 2)}}}<|im_end|>", "42") for i in range(n)]
    results: dict[int, dict] = {}

    def call(i: int) -> None:  # OpenRLHF: one sample per call, each in a thread of its own
        query, gold = cases[i]
        results[i] = reward.reward_func([PROMPT + query], [PROMPT], [gold])

    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        threads[0].start()
        assert first_batch.wait(120)
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(300)
        assert batches == [1, n - 1]  # serialised grading would give [1, 1, 1, 1, 1, 1]
        assert [results[i]["rewards"].tolist() for i in range(n)] == [[1.0 - (i % 2)] for i in range(n)]
        assert not reward.GRADER._pending and not reward.GRADER._grading
        # a batch call (several samples in one call) is one batch too
        out = reward.reward_func([PROMPT + q for q, _ in cases], [PROMPT] * n, [g for _, g in cases])
        assert out["rewards"].tolist() == [1.0 - (i % 2) for i in range(n)] and batches[-1] == n
    finally:
        reward.GRADER._grader.close()


def test_a_grading_failure_reaches_every_waiting_caller(monkeypatch, tmp_path):
    reward = _load_reward(monkeypatch, tmp_path, workers=1)

    class Broken(Grader):
        def grade(self, pairs):
            raise RuntimeError("pool gone")

    reward.GRADER._grader = Broken(workers=1, timeout=5)
    try:
        reward.reward_func([PROMPT + "\\boxed{42}"], [PROMPT], ["42"])
    except RuntimeError as exc:
        assert "pool gone" in str(exc)
    else:
        raise AssertionError("the failure was swallowed")
    assert not reward.GRADER._grading  # the next call can lead a batch again
