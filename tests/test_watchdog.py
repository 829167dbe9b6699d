"""The training watchdog (``calibrl.gpu.watchdog``): a launch whose progress stops is ended with a named message and
the retryable exit code; one that progresses is left alone. verl's launcher runs its trainer under it."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest

from calibrl.gpu import watchdog

# a trainer's wait that never returns, as verl's driver waits on a vLLM worker that died
HUNG = textwrap.dedent("""
    import logging, sys
    from calibrl.gpu import faults, watchdog
    logging.basicConfig(level=logging.INFO)
    with watchdog.Watchdog(watchdog.file_size(sys.argv[1]), limit_s=1, what="the trainer of m/grpo/s0", poll_s=0.1):
        faults.hang(sys.argv[2], "hang-2")  # the rehearsal's fault: blocks for good
""")


def test_a_launch_whose_progress_stops_is_ended_for_its_retry(tmp_path):
    from calibrl.gpu import faults

    marks = tmp_path / "rehearsal_faults"
    proc = subprocess.run([sys.executable, "-c", HUNG, str(tmp_path / "metrics.jsonl"), str(marks)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == watchdog.EXIT_CODE, proc.stderr
    assert (marks / "hang-2").is_file() and "rehearsal fault hang-2: the trainer blocks" in proc.stderr
    faults.hang(marks, "hang-2")  # fired once: the retry goes on
    assert "the trainer of m/grpo/s0: no progress for " in proc.stderr and "(limit 1 s)" in proc.stderr
    assert "the job's retry resumes from the last saved state" in proc.stderr


def _run(progress: list, limit_s: float) -> list[str]:
    """The watchdog over ``progress`` (one value a poll, then the last for ever) on a clock 10 s a poll."""
    values, clock, fired = iter(progress), itertools.count(0, 10), []
    last = [progress[-1]]

    def value():
        last[0] = next(values, last[0])
        return last[0]

    with watchdog.Watchdog(value, limit_s, "x", poll_s=0, stall=fired.append, clock=lambda: next(clock)) as dog:
        dog._thread.join(timeout=30)  # it returns once fired; a test that never fires stops on the join's timeout
    return fired


def test_each_change_restarts_the_clock_and_a_steady_value_fires_after_the_limit():
    # polls at 10, 20, ...: the change at 20 restarts the clock, the limit is passed at 50 (30 s unchanged)
    assert _run([0, 0, 1], limit_s=25) == ["x: no progress for 30 s (limit 25 s): a worker likely died under the "
                                           "trainer; ending the launch so that the job's retry resumes from the last "
                                           "saved state"]  # fmt: skip
    assert _run([0, 0, 0], limit_s=300)[0].startswith("x: no progress for 5.2 min (limit 5.0 min)")


def test_a_launch_that_progresses_is_left_alone():
    fired = []
    with watchdog.Watchdog(itertools.count().__next__, 0.05, "x", poll_s=0.01, stall=fired.append):
        import time

        time.sleep(0.5)
    assert fired == []
    with pytest.raises(ValueError, match="must be positive"):
        watchdog.Watchdog(lambda: 0, 0, "x")


def test_the_dead_engine_fault_kills_this_runs_engines_only_and_once(tmp_path, monkeypatch):
    """The rehearsal's fault behind the watchdog (``calibrl.gpu.faults.kill_engines``): the engine processes whose
    environment names this run's settings.json die; another run's engine, and this run's other processes, live."""
    import os

    from calibrl.checkpoints import SETTINGS_ENV
    from calibrl.gpu import faults

    def start(settings: str, *title: str) -> subprocess.Popen:
        code = "import time; time.sleep(120)"
        return subprocess.Popen([sys.executable, "-c", code, *title], env={**os.environ, SETTINGS_ENV: settings})

    ours, other_run, trainer = (start("/r/a/settings.json", faults.ENGINE), start("/r/b/settings.json", faults.ENGINE),
                                start("/r/a/settings.json"))  # fmt: skip
    try:
        monkeypatch.setenv(SETTINGS_ENV, "/r/a/settings.json")
        assert faults.kill_engines(tmp_path, "dead_engine-3") == 1
        assert ours.wait(timeout=30) == -9
        assert other_run.poll() is None and trainer.poll() is None
        assert faults.kill_engines(tmp_path, "dead_engine-3") == 0  # fired once: the retry trains on
        monkeypatch.setenv(SETTINGS_ENV, "/r/c/settings.json")
        with pytest.raises(RuntimeError, match="no VLLM::EngineCore process of this run"):
            faults.kill_engines(tmp_path, "dead_engine-4")
    finally:
        for proc in (ours, other_run, trainer):
            proc.kill()
            proc.wait()


def test_a_log_folder_progresses_as_its_files_grow(tmp_path):
    size = watchdog.folder_size(tmp_path / "tensorboard")
    assert size() == 0  # not written yet
    (tmp_path / "tensorboard" / "run").mkdir(parents=True)
    (tmp_path / "tensorboard" / "run" / "events.out.tfevents.1").write_bytes(b"x" * 10)
    (tmp_path / "tensorboard" / "events.out.tfevents.2").write_bytes(b"y" * 5)
    assert size() == 15
    assert watchdog.file_size(tmp_path / "nothing")() == 0
