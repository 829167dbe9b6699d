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

The stamp is typed: :class:`RunStamp`, whose :meth:`RunStamp.read` is the one reader of a ``settings.json`` (once
per process and file) and whose :meth:`RunStamp.to_dict` is what :func:`settings_job` writes, byte for byte the
file it always wrote. A backend's processes find the file through one variable, :data:`SETTINGS_ENV`.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from calibrl.io import write_json
from calibrl.spec import MethodSpec, TrainSettings

log = logging.getLogger("calibrl.checkpoints")

STAMP = "fingerprint.json"
LOCK = ".lock"
# What stays when a run's old work is moved aside: Snakemake's files (the run's settings, the evaluations).
KEEP = {"eval", "stale", "settings.json", LOCK}
SETTINGS_ENV = "CALIBRL_SETTINGS"
"""The variable that names a run's settings.json in the processes a backend's training starts (Ray's workers, vLLM's
engines, the reward file): a backend's launcher sets it, :meth:`RunStamp.from_env` reads it."""


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


# ----------------------------------------------------------------------------------------------- the stamp
class _ReadOnlyDict(dict):
    """A JSON object of a stamp: a dict to ``json.dumps``, ``isinstance`` and ``==``, that refuses changes (one stamp
    read serves every reader of a process). A copy (``dict(x)``, ``{**x}``, ``copy``, pickle) is a plain dict."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("a run's stamp is read-only: change a copy (RunStamp.to_dict)")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore

    def __reduce__(self):
        return dict, (dict(self),)


class _ReadOnlyList(list):
    """A JSON array of a stamp (:class:`_ReadOnlyDict`'s counterpart)."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("a run's stamp is read-only: change a copy (RunStamp.to_dict)")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore
    append = extend = insert = remove = pop = clear = sort = reverse = _refuse  # type: ignore

    def __reduce__(self):
        return list, (list(self),)


def _frozen(value):
    if isinstance(value, Mapping):
        return _ReadOnlyDict((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return _ReadOnlyList(_frozen(v) for v in value)
    return value


def _thawed(value):
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(v) for v in value]
    return value


@dataclass(frozen=True)
class RunStamp:
    """A run's ``settings.json``, typed: the one way the package reads it (:meth:`read`) and writes it
    (:meth:`to_dict`, :meth:`write`).

    ``fingerprint`` is the hash of ``settings`` and ``inputs`` (the run's identity); ``paths`` and ``resources`` sit
    beside them, outside it. :attr:`method` and :attr:`train` are ``settings``' compiled method (parsed once, when
    first asked for) and shared training settings. Its mappings are read-only: one stamp read serves a process."""

    fingerprint: str
    settings: Mapping[str, Any]  # calibrl.grid.train_params: run, backend, model, memory, method, seed, train, ...
    inputs: Mapping[str, str | None]  # name -> digest of each file the run trains from
    paths: Mapping[str, str]  # name -> absolute path of each input (a model's folder), and of a model's info file
    resources: Mapping[str, Any] | None  # the backend's layout (calibrl.grid.resources); None for a CPU backend
    path: Path | None = field(default=None, compare=False)  # the settings.json it was read from (resolved)

    def __post_init__(self) -> None:
        for name in ("settings", "inputs", "paths", "resources"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def __hash__(self) -> int:  # equal stamps have one fingerprint (their mappings are no keys)
        return hash(self.fingerprint)

    # -------------------------------------------------------------------------------------------- making one
    @classmethod
    def build(cls, settings: dict, inputs: dict, paths: dict | None = None, resources: dict | None = None) -> RunStamp:
        """A new run's stamp: its identity, the settings slice (``calibrl.grid.train_params``) and ``inputs`` (name
        -> digest of each file it reads), with the fingerprint of both; and beside it, outside the fingerprint,
        ``paths`` (name -> absolute path of each input; a model's folder) and ``resources`` (the backend's
        layout)."""
        return cls(fingerprint({"settings": settings, "inputs": inputs}), settings, inputs, paths or {}, resources)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str | Path | None = None) -> RunStamp:
        """The stamp of a settings.json's content (read from ``path``, if from a file)."""
        try:
            return cls(
                data["fingerprint"], data["settings"], data["inputs"], data["paths"], data["resources"],
                None if path is None else Path(path),
            )  # fmt: skip
        except KeyError as exc:
            where = f"{path}: " if path is not None else ""
            raise ValueError(f"{where}not a run's settings.json (calibrl.checkpoints.RunStamp): no {exc}") from None

    @classmethod
    def of(cls, stamp: RunStamp | Mapping[str, Any]) -> RunStamp:
        """``stamp`` as a :class:`RunStamp`: itself, or the stamp of a settings.json's content."""
        return stamp if isinstance(stamp, RunStamp) else cls.from_dict(stamp)

    @classmethod
    def read(cls, path: str | Path) -> RunStamp:
        """The run's stamp in the settings.json at ``path``: the one reader of the file. Read once per process for
        each version of the file (by its resolved path, inode, size and modification time)."""
        resolved = Path(path).resolve()
        st = resolved.stat()
        return _read_stamp(str(resolved), (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RunStamp | None:
        """The stamp of the run whose settings.json :data:`SETTINGS_ENV` names in ``environ``; None where it is
        unset (a process of no run)."""
        path = environ.get(SETTINGS_ENV)
        return cls.read(path) if path else None

    # ------------------------------------------------------------------------------------------- reading one
    @cached_property
    def method(self) -> MethodSpec:
        """The run's compiled method (``settings.method``, ``calibrl.spec.compile_method``'s), parsed once."""
        if self.settings.get("method") is None:
            raise ValueError(f"{self._where()}no compiled method (settings.method): not a training run's stamp")
        return MethodSpec.from_dict(self.settings["method"])

    @property
    def train(self) -> Mapping[str, Any]:
        """The shared training settings (``settings.train``: ``calibrl.spec.TrainSettings``' fields, less ``steps``
        for a backend whose longer runs resume shorter ones); typed: :meth:`train_settings`."""
        return self.settings["train"]

    @property
    def run(self) -> str:
        """The run's path, ``{model}/{method}/s{seed}`` (``calibrl.runs.Run.path``)."""
        return self.settings["run"]

    @property
    def backend(self) -> str:
        """The trainer that trains it (``grid.trainer``: a ``calibrl.backends`` name)."""
        return self.settings["backend"]

    @property
    def seed(self) -> int:
        return self.settings["seed"]

    @property
    def run_dir(self) -> Path:
        """The run's folder: where its settings.json is."""
        if self.path is None:
            raise ValueError(f"the stamp of {self.settings.get('run')} was not read from a file: it has no folder")
        return self.path.parent

    def train_settings(self, steps: int | None = None) -> TrainSettings:
        """:attr:`train` typed, with ``steps`` set where given (a backend whose longer runs resume shorter ones has
        no ``steps`` in its settings: the segment's end is the job's)."""
        return TrainSettings.from_config(self.train if steps is None else {**self.train, "steps": steps})

    def _where(self) -> str:
        return f"{self.path}: " if self.path is not None else ""

    # ------------------------------------------------------------------------------------------- writing one
    def to_dict(self) -> dict:
        """The settings.json's content, plain (a new copy): what :func:`settings_job` writes, byte for byte as
        before the stamp had a type (``calibrl.io.write_json``)."""
        return {
            "fingerprint": self.fingerprint,
            "settings": _thawed(self.settings),
            "inputs": _thawed(self.inputs),
            "paths": _thawed(self.paths),
            "resources": _thawed(self.resources),
        }

    def write(self, path: str | Path) -> None:
        """Write it (atomically) as a settings.json, or the copy :func:`claim` keeps in ``ckpt/``."""
        write_json(path, self.to_dict())


@lru_cache(maxsize=64)
def _read_stamp(resolved: str, version: tuple) -> RunStamp:
    """:meth:`RunStamp.read`'s cache: one parse per file version (``version``) and process."""
    return RunStamp.from_dict(json.loads(Path(resolved).read_text(encoding="utf-8")), resolved)


def stamp(settings: dict, inputs: dict, paths: dict | None = None, resources: dict | None = None) -> dict:
    """A run's ``settings.json`` content (:meth:`RunStamp.build`, as a plain dict)."""
    return RunStamp.build(settings, inputs, paths, resources).to_dict()


def claim(run_dir: str | Path, new: RunStamp | dict) -> bool:
    """Make the run folder safe to resume under the stamp ``new``. Returns True when its existing
    checkpoints were made with exactly these settings and inputs and may be resumed; otherwise moves them
    aside (with the metrics they produced), stamps ``ckpt/`` for the new ones and returns False. Call it while
    holding :func:`run_lock`."""
    run = Path(run_dir)
    ckpt = run / "ckpt"
    new = RunStamp.of(new)
    settings, inputs = new.settings, new.inputs
    old = _read(ckpt / STAMP)
    leftovers = [p for p in run.iterdir() if p.name not in KEEP and _holds_files(p)] if run.is_dir() else []
    if old is not None and old.get("fingerprint") == new.fingerprint:
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
    new.write(ckpt / STAMP)
    return False


def date_settings(settings_path: str | Path) -> None:
    """Date a freshly written ``settings.json`` to when its run's checkpoints were first stamped with the same
    fingerprint, if they were. Rule run_settings can rerun with unchanged content (a forced upstream rule, a
    data file rebuilt byte for byte); the training job then resumes and backdates its markers to their
    checkpoints (:func:`write_marker`), and a settings file newer than those would make Snakemake plan the
    training again on every invocation."""
    settings_path = Path(settings_path)
    ckpt_stamp = settings_path.parent / "ckpt" / STAMP
    old = _read(ckpt_stamp)  # the copy claim() kept: of any version, or none
    if old is not None and old.get("fingerprint") == RunStamp.read(settings_path).fingerprint:
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
    new = RunStamp.build(settings, digests, paths, resources)
    log.info("%s: fingerprint %s", new.run, new.fingerprint)
    new.write(out_path)
    date_settings(out_path)
