"""torch's build lock for JIT extensions, which a killed job can no longer leave behind to hang the next ones.

``torch.utils.cpp_extension`` builds an extension, or finds it built, under a ``FileBaton``: a lock file created
with ``O_EXCL`` and removed when done, on which every other process polls until it is gone. It takes the lock on
each load, not only to compile (DeepSpeed loads its ops at each start; on CPU its shared-memory collective,
``deepspeed.comm.torch.build_shm_op``). A process killed while it holds the lock (a preempted job, a Ray actor
stopped with its cluster) leaves the file, and every later load in that cache folder waits forever: the jobs of a
user on a node share it (``calibrl.offline.cache_env``). So the holder writes who it is into the lock (host, pid,
pid namespace), and a process that finds the lock taken removes it when that holder is gone; a lock without a
holder (written by an unpatched torch) once it is older than :data:`STALE_AFTER`. A load that broke a lock builds
the extension itself.

Imports only the standard library (it runs first thing in every Ray worker: :mod:`calibrl.gpu.patching`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from types import ModuleType

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.gpu.extension_lock")

TRY_ACQUIRE = Target("torch.utils.file_baton", "FileBaton.try_acquire", params=("self",))
WAIT = Target("torch.utils.file_baton", "FileBaton.wait", params=("self",))
TARGETS = (TRY_ACQUIRE, WAIT)
TAG = "extension_lock"
STALE_AFTER = 3600.0  # seconds: a lock naming no holder is older than any build


def install() -> None:
    when_imported(TRY_ACQUIRE.module, _patch)


def _patch(module: ModuleType) -> None:
    def make_try_acquire(original):
        def try_acquire(self):
            if not original(self) and not (_break(self.lock_file_path) and original(self)):
                return False
            with open(self.lock_file_path, "w") as f:  # torch's own descriptor is opened read-only
                f.write(_me())
            return True

        return try_acquire

    def make_wait(original):
        def wait(self):
            # torch's wait, polling until the lock is gone, or until its holder is (torch then loads what is built)
            while os.path.exists(self.lock_file_path) and not _break(self.lock_file_path):
                time.sleep(self.wait_seconds)

        return wait

    TRY_ACQUIRE.wrap(module, TAG, make_try_acquire)
    WAIT.wrap(module, TAG, make_wait)


def _me() -> str:
    return f"{socket.gethostname()} {os.getpid()} {_pid_namespace()}\n"


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "-"


def _read(path: str) -> tuple[str, float] | None:
    """The lock's text and modification time; None if it is gone."""
    try:
        with open(path) as f:
            return f.read(), os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _gone(holder: tuple[str, float]) -> bool:
    """Whether the holder the lock names is dead: a process of this host and pid namespace that no longer runs, or,
    where the lock names none that can be checked here, a lock older than :data:`STALE_AFTER`."""
    text, mtime = holder
    fields = text.split()
    if len(fields) == 3 and fields[0] == socket.gethostname() and fields[2] == _pid_namespace():
        pid = int(fields[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another user's process holds the pid: ours is gone
            return True
        try:  # a zombie is dead, waiting for its parent
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return False
    return time.time() - mtime > STALE_AFTER


def _break(path: str) -> bool:
    """Remove the lock at ``path`` if its holder is gone; whether the lock is gone now. The lock is moved aside
    first and removed only if it is still the one judged, so a lock another process took meanwhile stays."""
    holder = _read(path)
    if holder is None:
        return True
    if not _gone(holder):
        return False
    aside = f"{path}.stale-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True
    if _read(aside) != holder:  # a new holder took the lock between the read and the move: give it back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        os.remove(aside)
        return False
    os.remove(aside)
    log.warning("removed the build lock %s of a process that is gone (%s)", path, holder[0].strip() or "no holder")
    return True
