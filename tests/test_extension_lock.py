"""torch's build lock for JIT extensions (calibrl.gpu.extension_lock): a lock whose holder is gone is taken over, a
live holder's is waited for, as torch's own FileBaton does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO

from calibrl.gpu import extension_lock as EL


@pytest.fixture
def baton(monkeypatch):
    """torch's FileBaton with the patch applied (undone after the test)."""
    from torch.utils import file_baton

    for name in ("try_acquire", "wait"):
        monkeypatch.setattr(file_baton.FileBaton, name, getattr(file_baton.FileBaton, name))
    EL._patch(file_baton)
    return file_baton.FileBaton


def held_by(path, pid: int, host: str | None = None) -> None:
    path.write_text(f"{host or socket.gethostname()} {pid} {EL._pid_namespace()}\n")


def test_a_lock_whose_holder_died_is_taken_and_names_its_new_holder(baton, tmp_path):
    lock = tmp_path / "lock"
    dead = subprocess.Popen(["true"])
    dead.wait()
    held_by(lock, dead.pid)  # what a job killed while it held the lock leaves
    b = baton(str(lock))
    assert b.try_acquire()
    assert lock.read_text().split()[:2] == [socket.gethostname(), str(os.getpid())]
    b.release()
    assert not lock.exists()


def test_a_live_holder_is_waited_for_until_it_is_gone_or_a_zombie(baton, tmp_path):
    lock = tmp_path / "lock"
    holder = subprocess.Popen(["sleep", "60"])
    held_by(lock, holder.pid)
    b = baton(str(lock), wait_seconds=0.05)
    assert not b.try_acquire()
    waiter = threading.Thread(target=b.wait)
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive() and lock.exists()  # the holder runs: the lock is its
    os.kill(holder.pid, signal.SIGKILL)  # killed, not reaped yet: a zombie is dead too
    waiter.join(timeout=10)
    assert not waiter.is_alive() and not lock.exists()
    holder.wait()


def test_a_lock_naming_no_holder_is_taken_only_once_older_than_any_build(baton, tmp_path):
    lock = tmp_path / "lock"
    lock.touch()  # an unpatched torch's lock: empty
    assert not baton(str(lock)).try_acquire()
    held_by(lock, 1, host="another-node")  # a holder that cannot be checked here: by age alone
    assert not baton(str(lock)).try_acquire()
    old = time.time() - EL.STALE_AFTER - 60
    os.utime(lock, (old, old))
    assert baton(str(lock)).try_acquire()


def test_a_lock_taken_by_a_new_holder_meanwhile_is_left_to_it(monkeypatch, tmp_path):
    """Between the read that judged the lock stale and its move aside, another process broke it and took it: the
    move catches the new holder's lock, which goes back in place."""
    lock = tmp_path / "lock"
    dead = subprocess.Popen(["true"])
    dead.wait()
    held_by(lock, dead.pid)
    read = EL._read

    def racing(path):
        got = read(path)
        if path == str(lock) and got and str(dead.pid) in got[0]:
            held_by(lock, os.getpid())  # the new holder, this (live) process
        return got

    monkeypatch.setattr(EL, "_read", racing)
    assert not EL._break(str(lock))
    assert lock.read_text().split()[1] == str(os.getpid()) and [p.name for p in tmp_path.iterdir()] == ["lock"]


def test_the_patch_applies_when_torch_loads_the_baton_and_its_targets_are_in_the_pinned_torch():
    for target in EL.TARGETS:
        target.check()
    code = (
        "import sys; from calibrl.gpu import extension_lock as EL; EL.install(); "
        "from torch.utils.cpp_extension import FileBaton; "
        "assert EL.TAG in FileBaton.try_acquire.__calibrl_patch__ and EL.TAG in FileBaton.wait.__calibrl_patch__"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)
