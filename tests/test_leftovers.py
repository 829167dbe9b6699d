"""A run's processes left behind (``calibrl.gpu.leftovers``), which the launchers kill when their trainer ends: found
by the settings path in their environment, this run's only (or a work folder's), never the caller or its parents."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from calibrl.checkpoints import SETTINGS_ENV
from calibrl.gpu import leftovers


def start(settings: str, *args: str, code: str = "import time; time.sleep(120)") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, SETTINGS_ENV: settings})


def test_only_this_runs_processes_die(tmp_path):
    a, b = tmp_path / "w/m/a/s0/settings.json", tmp_path / "w/m/b/s0/settings.json"
    ours, other_run, outside = start(str(a)), start(str(b)), start(str(tmp_path / "elsewhere/settings.json"))
    try:
        assert leftovers.kill(a) == [ours.pid]
        assert ours.wait(timeout=30) == -9
        assert other_run.poll() is None and outside.poll() is None
        assert leftovers.kill(a) == []  # nothing left: a clean launch's call is a no-op
        assert leftovers.kill(tmp_path / "w", under=True) == [other_run.pid]  # a work folder's runs
        assert other_run.wait(timeout=30) == -9 and outside.poll() is None
    finally:
        for proc in (ours, other_run, outside):
            proc.kill()
            proc.wait()


def test_the_launcher_itself_and_its_parents_are_spared(tmp_path):
    """A launcher whose own environment names the run (verl's does) kills its run's leftovers and lives on."""
    settings = tmp_path / "r/settings.json"
    launcher = textwrap.dedent(f"""
        import subprocess, sys
        from calibrl.gpu import leftovers
        engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        print(leftovers.kill({str(settings)!r}) == [engine.pid], engine.wait(timeout=30))
    """)
    out = subprocess.run([sys.executable, "-c", launcher], env={**os.environ, SETTINGS_ENV: str(settings)},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "-9"]


def test_what_ends_within_the_grace_is_not_killed(tmp_path):
    """After ``ray.shutdown()`` Ray ends a job's workers itself within seconds: the launcher waits that long and kills
    only what outlives it."""
    settings = str(tmp_path / "r/settings.json")
    ending, stuck = start(settings, code="import time; time.sleep(0.5)"), start(settings)
    try:
        assert leftovers.kill(settings, grace_s=8) == [stuck.pid]
        assert ending.wait(timeout=30) == 0 and stuck.wait(timeout=30) == -9
    finally:
        for proc in (ending, stuck):
            proc.kill()
            proc.wait()
