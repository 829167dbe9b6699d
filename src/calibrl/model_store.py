"""Hub models downloaded once, on the login node, at a locked commit, into a shared folder.

Compute nodes are often offline, and every Ray actor fetching its own copy from the Hub is slow at best:
the workflow's ``download_model`` rule (workflow/rules/models.smk, a local rule) puts each model of the
grid into ``grid.models_dir`` (``calibrl.grid.model_path``: ``<models_dir>/<org>--<name>/<revision>``), and
the jobs that read it get that absolute path and run with ``HF_HUB_OFFLINE=1``. The rule's output,
``{results}/models/<name>/hub.json``, records the path, the revision asked for and the commit downloaded, and
the file list; it is what later rules depend on.

A revision such as ``main`` moves. The lock file (``grid.models_lock``, ``models.lock.yaml`` in the checkout:
commit it, and every site downloads the same weights) maps ``<hf_id>@<revision>`` to the commit the first
download resolved it to; later downloads fetch that commit, never ``main``'s newest, and every job that reads a
model checks its folder against the lock (:func:`verify`) before it starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
from pathlib import Path

import yaml

from calibrl.io import write_json, write_text

log = logging.getLogger("calibrl.model_store")

# What the paper's runs read: weights, config, tokenizer, generation defaults (no other formats).
ALLOW = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "merges.txt", "vocab.*"]
LOCK_HEADER = (
    "# Hub models at the commit their revision resolved to when first downloaded (calibrl.model_store).\n"
    "# Later downloads fetch exactly these commits and every job checks its model folder against them.\n"
    "# Commit this file. To move a model to a newer commit, delete its line and run download_model again.\n"
)
_SHA = re.compile(r"[0-9a-f]{40}")


class ModelNotAvailable(RuntimeError):
    """The model is neither in the shared folder nor reachable on the Hub."""


class ModelNotLocked(RuntimeError):
    """A model folder whose commit is not the one the lock file names."""


def is_complete(path: str | Path) -> bool:
    """A finished download: ``download`` writes ``.complete`` (the commit) last."""
    return (Path(path) / ".complete").is_file()


def folder_commit(path: str | Path) -> str:
    """The commit a finished download holds (its ``.complete``)."""
    return (Path(path) / ".complete").read_text(encoding="utf-8").strip()


# ------------------------------------------------------------------------------------------- the lock
def lock_key(hf_id: str, revision: str | None) -> str:
    return f"{hf_id}@{revision or 'main'}"


def read_lock(lock_path: str | Path) -> dict[str, str]:
    path = Path(lock_path)
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    if data is not None and not (isinstance(data, dict) and all(_SHA.fullmatch(str(v)) for v in data.values())):
        raise ModelNotLocked(f"{path}: not a lock file (lines '<hf_id>@<revision>: <40-hex commit>')")
    return {str(k): str(v) for k, v in (data or {}).items()}


@contextlib.contextmanager
def _locked(lock_path: Path):
    """An exclusive lock beside ``lock_path`` (the lock file's, a model folder's): download_model jobs run side by
    side."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path.with_name(f".{lock_path.name}.flock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def record(lock_path: str | Path, hf_id: str, revision: str | None, commit: str) -> None:
    """Add ``hf_id@revision: commit`` to the lock; an entry with another commit is refused."""
    path, key = Path(lock_path), lock_key(hf_id, revision)
    with _locked(path):
        entries = read_lock(path)
        if entries.get(key, commit) != commit:
            raise ModelNotLocked(f"{path}: {key} is locked at {entries[key]}, not {commit}")
        if key not in entries:
            entries[key] = commit
            body = "".join(f"{k}: {v}\n" for k, v in sorted(entries.items()))
            write_text(path, LOCK_HEADER + body)
            log.info("%s: locked %s at %s", path, key, commit)


def verify(path: str | Path, hf_id: str, revision: str | None, lock_path: str | Path) -> str:
    """The commit of the model folder ``path``, after checking it is the one the lock names; raises
    :class:`ModelNotLocked` naming both and what to do."""
    key, lock = lock_key(hf_id, revision), Path(lock_path)
    if not is_complete(path):
        raise ModelNotLocked(f"{path}: no finished download of {key} (run rule download_model on the login node)")
    have, want = folder_commit(path), read_lock(lock).get(key)
    if want is None:
        raise ModelNotLocked(f"{key} is not in the lock file {lock}: run rule download_model, which records it")
    if have != want:
        raise ModelNotLocked(
            f"{path} holds {key} at commit {have}, the lock file {lock} says {want}: another download replaced it. "
            f"Remove the folder and run download_model (it fetches {want}), or delete the lock's line to move on."
        )
    return have


# -------------------------------------------------------------------------------------------- download
def download(hf_id: str, revision: str | None, path: str | Path, info_path: str | Path, lock_path: str | Path) -> dict:
    """``hf_id`` at the commit the lock names for ``revision`` (none yet: what ``revision``, default "main",
    resolves to now, then locked) into ``path``, once: a complete folder at that commit is kept as it is. Writes
    ``info_path`` (path, revision, commit, files).

    Offline (``HF_HUB_OFFLINE=1``) or without the Hub, raises :class:`ModelNotAvailable` naming the folder to
    pre-seed and the command that does it on a machine with internet."""
    path = Path(path).resolve()
    with _locked(path):  # two model names for one Hub id and revision share the folder
        return _download(hf_id, revision, path, info_path, lock_path)


def _download(hf_id: str, revision: str | None, path: Path, info_path: str | Path, lock_path: str | Path) -> dict:
    rev = revision or "main"
    want = read_lock(lock_path).get(lock_key(hf_id, revision))
    if is_complete(path):
        log.info("%s@%s: already in %s", hf_id, rev, path)
        commit = folder_commit(path)
        if not _SHA.fullmatch(commit):
            raise ModelNotAvailable(
                f"{path}/.complete says {commit!r}, not a commit: write the 40-hex commit the folder holds into it"
            )
    else:
        if revision is None:
            log.warning("%s: no grid.models.<name>.revision pinned; main resolves once, then the lock holds it", hf_id)
        commit = want or _resolve(hf_id, rev, path)
        _fetch(hf_id, commit, path)
        write_text(path / ".complete", f"{commit}\n")
    if want is not None and commit != want:
        verify(path, hf_id, revision, lock_path)  # raises, naming both commits
    record(lock_path, hf_id, revision, commit)
    if not (path / "config.json").is_file():
        raise ModelNotAvailable(f"{path}: no config.json; not a Hugging Face model folder (remove it to re-download)")
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
    info = {
        "hf_id": hf_id,
        "revision": rev,
        "resolved_revision": commit,
        "path": str(path),
        "lock": str(Path(lock_path).resolve()),
        "files": files,
    }
    write_json(info_path, info)
    return info


def verify_info(info_path: str | Path) -> str:
    """:func:`verify` for the download an info file (``hub.json``) records: what a job runs before it reads it."""
    import json

    info = json.loads(Path(info_path).read_text(encoding="utf-8"))
    return verify(info["path"], info["hf_id"], info["revision"], info["lock"])


def _not_available(hf_id: str, rev: str, path: Path, exc: Exception) -> ModelNotAvailable:
    metadata = f"{path}/.cache/huggingface/download/config.json.metadata"  # its first line: the commit
    return ModelNotAvailable(
        f"{hf_id}@{rev}: cannot download ({type(exc).__name__}: {str(exc)[:200]}). This rule runs on the "
        f"login node and needs the Hub; offline, pre-seed the folder {path} on a machine with internet: "
        f"`huggingface-cli download {hf_id} --revision {rev} --local-dir {path}`, then "
        f"`head -n1 {metadata} > {path}/.complete` (the commit it holds; grid.models_dir holds the models; "
        f"HF_HUB_OFFLINE is {'set' if _offline() else 'not set'})"
    )


def _resolve(hf_id: str, rev: str, path: Path) -> str:
    """The commit ``rev`` points to now (what a first download locks)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(hf_id, revision=rev).sha
    except Exception as exc:
        raise _not_available(hf_id, rev, path, exc) from exc


def _fetch(hf_id: str, commit: str, path: Path) -> None:
    from huggingface_hub import snapshot_download

    path.mkdir(parents=True, exist_ok=True)
    try:
        snapshot_download(repo_id=hf_id, revision=commit, local_dir=str(path), allow_patterns=ALLOW)
    except Exception as exc:
        raise _not_available(hf_id, commit, path, exc) from exc


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def download_model_job(params: dict, info_path: str) -> None:
    """One Hub model into the shared folder, once, at its pinned revision (``params``: ``grid.download_params``;
    ``calibrl.model_store``)."""
    info = download(params["hf_id"], params["revision"], params["path"], info_path, params["lock"])
    log.info(
        "%s@%s (%s): %d files in %s",
        info["hf_id"],
        info["revision"],
        info["resolved_revision"],
        len(info["files"]),
        info["path"],
    )
