"""A training run's folder as its single writer keeps it: a lock, the settings stamp, and the checkpoint markers.

``runs/{model}/{method}/s{seed}/`` holds ``ckpt/`` (checkpoints, undeclared so a failed job keeps them, and
the ``step_{k}.done`` markers Snakemake tracks), ``metrics.jsonl`` and the evaluations ``eval/``. Three rules:

* one writer: a training job holds :func:`run_lock` for as long as it runs; a second job on the same run
  fails at once, naming the holder. The lock is the kernel's (``flock``; Linux maps it to NFS byte-range
  locks on NFS), so a killed holder's lock is gone with it and the next job takes over, with no stale-lock
  file to clean;
* checkpoints carry the settings that made them: the run's :func:`stamp` (its ``calibrl.grid.train_params``
  slice, the digests of its input files, and a fingerprint of both; beside them, where the input files are and
  how the run is laid out, no part of its identity) is a file of the DAG, ``settings.json``, made by its own
  small rule whose params are that slice. It is the only thing a backend reads. Training and evaluation both
  read it, so a changed setting or input reruns both, while a resumed run (whose markers evaluation takes
  as ancient()) reruns neither. :func:`claim` copies the stamp into ``ckpt/``; a job whose stamp differs
  moves what the old settings made aside to ``stale/<old fingerprint>/`` and trains from scratch, logging
  which keys changed, so a checkpoint made with other settings is never resumed;
* every marker names that fingerprint (:func:`write_marker`), and evaluation refuses a checkpoint whose
  fingerprint is not the run's current one (:func:`check_marker`), so a stale checkpoint is never
  evaluated as if it were current.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from calibrl.io import write_json

log = logging.getLogger("calibrl.checkpoints")

STAMP = "fingerprint.json"
LOCK = ".lock"
# What stays when a run's old work is moved aside: Snakemake's files (the run's settings, the evaluations).
KEEP = {"eval", "stale", "settings.json", LOCK}


class RunLocked(RuntimeError):
    """Another live process is training this run."""


class LockUnsupported(OSError):
    """The run folder's file system cannot lock files (a Lustre mount without ``flock``, NFS without locking)."""


class StaleCheckpoint(RuntimeError):
    """A checkpoint made with other settings than the ones the job was asked to evaluate."""


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold the run folder's lock for the duration; fail at once with the holder's name if it is taken."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    path = run / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LockUnsupported(
                f"{path}: the file system does not support locks ({errno.errorcode.get(exc.errno, exc.errno)}: "
                f"{exc.strerror}); a Lustre mount needs the 'flock' option (mount -t lustre -o flock), an NFS "
                f"mount its lock service (not 'nolock'). Put grid.results on such a file system."
            ) from None
        raise RunLocked(
            f"{run} is being trained by another job ({holder}); two trainers never write one run. "
            f"Wait for it, or stop it, then run again."
        ) from None
    previous = _holder(fd)
    if previous != "unknown holder":
        log.warning("took over the lock of %s, which no longer holds it (it died or was killed)", previous)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    try:
        yield
    finally:
        os.ftruncate(fd, 0)  # an empty lock file: nobody holds it
        os.close(fd)  # releases the lock


def _holder(fd: int) -> str:
    """Who wrote the lock file last (read through the lock's own descriptor)."""
    try:
        h = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return "unknown holder"
    return f"pid {h['pid']} on {h['host']} since {h['since']}" if h.get("pid") else "unknown holder"


def digest(path: str | Path | None) -> str | None:
    """sha256 of a file, or of every file below a folder (names and contents); None for no path."""
    if path is None:
        return None
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():  # hidden names are the temporaries of killed writes (calibrl.io), never content
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    else:
        files = [path]
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def fingerprint(settings: dict) -> str:
    """A short stable hash of a settings slice (canonical JSON: key order and int/float spelling of the same
    YAML do not matter to json.dumps of the parsed values)."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_keys(old, new, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two settings slices (for the log of a retrained run)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += changed_keys(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    return [] if old == new else [prefix.rstrip(".") or "(all)"]


def stamp(settings: dict, inputs: dict, paths: dict | None = None, resources: dict | None = None) -> dict:
    """A run's ``settings.json``: its identity, the settings slice (``calibrl.grid.train_params``) and ``inputs``
    (name -> digest of each file it reads), with the fingerprint of both; and beside it, outside the fingerprint,
    ``paths`` (name -> absolute path of each input; a model's folder) and ``resources`` (the backend's layout)."""
    identity = {"settings": settings, "inputs": inputs}
    return {"fingerprint": fingerprint(identity), **identity, "paths": paths or {}, "resources": resources}


def read_stamp(path: str | Path) -> dict:
    """A run's ``settings.json``."""
    return json.loads(Path(path).read_text())


def claim(run_dir: str | Path, new: dict) -> bool:
    """Make the run folder safe to resume under the :func:`stamp` ``new``. Returns True when its existing
    checkpoints were made with exactly these settings and inputs and may be resumed; otherwise moves them
    aside (with the metrics they produced), stamps ``ckpt/`` for the new ones and returns False. Call it while
    holding :func:`run_lock`."""
    run = Path(run_dir)
    ckpt = run / "ckpt"
    settings, inputs = new["settings"], new["inputs"]
    old = _read(ckpt / STAMP)
    leftovers = [p for p in run.iterdir() if p.name not in KEEP and _holds_files(p)] if run.is_dir() else []
    if old is not None and old.get("fingerprint") == new["fingerprint"]:
        return True
    if leftovers:
        if old is None:
            why = "they carry no settings stamp (made by an older version or by hand)"
            name = "unstamped"
        else:
            keys = changed_keys(old.get("settings"), settings) + [
                f"input {k}"
                for k in sorted(set(old.get("inputs", {})) | set(inputs))
                if old.get("inputs", {}).get(k) != inputs.get(k)
            ]
            why = f"settings changed: {', '.join(keys) or 'the fingerprint'}"
            name = old.get("fingerprint", "unstamped")
        aside = run / "stale" / name
        if aside.exists():
            shutil.rmtree(aside)
        aside.mkdir(parents=True)
        for p in leftovers:
            os.replace(p, aside / p.name)
        log.warning("%s: not resuming its checkpoints, %s; moved them to %s and training from scratch", run, why, aside)
    ckpt.mkdir(parents=True, exist_ok=True)
    write_json(ckpt / STAMP, new)
    return False


def date_settings(settings_path: str | Path) -> None:
    """Date a freshly written ``settings.json`` to when its run's checkpoints were first stamped with the same
    fingerprint, if they were. Rule run_settings can rerun with unchanged content (a forced upstream rule, a
    data file rebuilt byte for byte); the training job then resumes and backdates its markers to their
    checkpoints (:func:`write_marker`), and a settings file newer than those would make Snakemake plan the
    training again on every invocation."""
    settings_path = Path(settings_path)
    ckpt_stamp = settings_path.parent / "ckpt" / STAMP
    old, new = _read(ckpt_stamp), _read(settings_path)
    if old is not None and new is not None and old.get("fingerprint") == new.get("fingerprint"):
        when = ckpt_stamp.stat().st_mtime
        os.utime(settings_path, (when, when))


def _holds_files(path: Path) -> bool:
    """Work worth keeping: a file, or a folder with a file below it (Snakemake makes the empty ``ckpt/``
    folder of the markers before the job starts)."""
    return path.is_file() or any(p.is_file() for p in path.rglob("*"))


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_marker(path: str | Path, step: int, policy_dir: str | Path) -> None:
    """A checkpoint's marker ``ckpt/step_{k}.done`` (JSON: step, policy path, the fingerprint stamped on its
    ``ckpt/`` folder), dated to the checkpoint.

    A resumed run rewrites the markers of the checkpoints it already had (Snakemake removes a failed job's
    outputs); giving each the time its checkpoint was saved, not the time of the rewrite, keeps it older than
    the evaluations made from it, so an mtime-triggered rerun does not evaluate those checkpoints again.
    """
    path, policy_dir = Path(path), Path(policy_dir).resolve()
    stamp = _read(path.parent / STAMP) or {}
    write_json(path, {"step": int(step), "policy": str(policy_dir), "fingerprint": stamp.get("fingerprint")})
    saved = policy_dir / "config.json"  # every Hugging Face checkpoint has one, written with the weights
    when = (saved if saved.exists() else policy_dir).stat().st_mtime
    os.utime(path, (when, when))


def check_marker(marker: str | Path, expected: str) -> dict:
    """The marker's content, after checking its checkpoint was trained with the settings of fingerprint
    ``expected`` (the run's current ``settings.json``)."""
    content = json.loads(Path(marker).read_text())
    if content.get("fingerprint") != expected:
        raise StaleCheckpoint(
            f"{marker}: checkpoint trained with settings {content.get('fingerprint')}, but the config asks for "
            f"{expected}. Its training job has not rerun with the current settings: run the workflow for this "
            f"target (Snakemake plans the training job first) rather than forcing the evaluation alone."
        )
    return content


def model_dir(info: str | None) -> str | None:
    """The model folder a warm start's or a download's info file names (None for no file)."""
    return json.loads(Path(info).read_text())["path"] if info else None


MODEL_INPUTS = ("init", "memory")
"""Inputs that are a model's info file (a warm start's, a download's): the run reads the folder it names."""


def settings_job(settings: dict, resources: dict | None, out_path: str, inputs: dict[str, str]) -> None:
    """Rule run_settings' job: the run's ``settings.json`` (:func:`stamp`): its config slice (``grid.train_params``),
    the digests and absolute paths of the files it trains from (``inputs``: name -> file; a model's info file
    stands for the folder it names), and its layout (``grid.resources``)."""
    paths = {
        name: str(Path(model_dir(path) if name in MODEL_INPUTS else path).resolve()) for name, path in inputs.items()
    }
    digests = {name: digest(path) for name, path in paths.items()}
    # where each model's info file is (a download's names its lock: the job checks the folder against it)
    paths |= {f"{name}_info": str(Path(path).resolve()) for name, path in inputs.items() if name in MODEL_INPUTS}
    new = stamp(settings, digests, paths, resources)
    log.info("%s: fingerprint %s", settings["run"], new["fingerprint"])
    write_json(out_path, new)
    date_settings(out_path)
