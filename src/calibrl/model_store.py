"""Hub models downloaded once, on the login node, at a pinned revision, into a shared folder.

Compute nodes are often offline, and every Ray actor fetching its own copy from the Hub is slow at best:
the workflow's ``download_model`` rule (workflow/rules/models.smk, a local rule) puts each model of the
grid into ``grid.models_dir`` (``calibrl.grid.model_path``: ``<models_dir>/<org>--<name>/<revision>``), and
the jobs that read it get that absolute path and run with ``HF_HUB_OFFLINE=1``. The rule's output,
``{results}/models/<name>/hub.json``, records the path, the revision asked for and the commit it resolved
to, and the file list; it is what later rules depend on.
"""

from __future__ import annotations

import logging
from pathlib import Path

from calibrl.io import write_json

log = logging.getLogger("calibrl.model_store")

# What the paper's runs read: weights, config, tokenizer, generation defaults (no other formats).
ALLOW = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken", "merges.txt", "vocab.*"]


class ModelNotAvailable(RuntimeError):
    """The model is neither in the shared folder nor reachable on the Hub."""


def is_complete(path: str | Path) -> bool:
    """A finished download: ``download`` writes ``.complete`` last."""
    return (Path(path) / ".complete").is_file()


def download(hf_id: str, revision: str | None, path: str | Path, info_path: str | Path) -> dict:
    """``hf_id`` at ``revision`` (a commit sha pins it; None means the newest "main", recorded) into ``path``,
    once: a complete folder is kept as it is. Writes ``info_path`` (path, revision, resolved commit, files).

    Offline (``HF_HUB_OFFLINE=1``) or without the Hub, raises :class:`ModelNotAvailable` naming the folder to
    pre-seed and the command that does it on a machine with internet."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    path = Path(path).resolve()
    rev = revision or "main"
    resolved = None
    if is_complete(path):
        log.info("%s@%s: already in %s", hf_id, rev, path)
        resolved = (path / ".complete").read_text(encoding="utf-8").strip() or None
    else:
        if revision is None:
            log.warning("%s: no grid.models.<name>.revision pinned; taking main and recording its commit", hf_id)
        path.mkdir(parents=True, exist_ok=True)
        try:
            snapshot_download(repo_id=hf_id, revision=rev, local_dir=str(path), allow_patterns=ALLOW)
        except (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError) as exc:
            raise ModelNotAvailable(
                f"{hf_id}@{rev}: cannot download ({type(exc).__name__}: {str(exc)[:200]}). This rule runs on the "
                f"login node and needs the Hub; offline, pre-seed the folder {path} on a machine with internet: "
                f"`huggingface-cli download {hf_id} --revision {rev} --local-dir {path}` then "
                f"`echo {rev} > {path}/.complete` (grid.models_dir holds the models; HF_HUB_OFFLINE is "
                f"{'set' if _offline() else 'not set'})"
            ) from exc
        resolved = _resolved_commit(hf_id, rev)
        (path / ".complete").write_text(f"{resolved or rev}\n", encoding="utf-8")
    if not (path / "config.json").is_file():
        raise ModelNotAvailable(f"{path}: no config.json; not a Hugging Face model folder (remove it to re-download)")
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
    info = {"hf_id": hf_id, "revision": rev, "resolved_revision": resolved, "path": str(path), "files": files}
    write_json(info_path, info)
    return info


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _resolved_commit(hf_id: str, rev: str) -> str | None:
    """The commit sha ``rev`` pointed to (None when the Hub cannot say)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().model_info(hf_id, revision=rev).sha
    except Exception as exc:  # the download worked; a missing sha only weakens the record
        log.warning("%s@%s: could not resolve the commit (%s)", hf_id, rev, exc)
        return None


def download_model_job(params: dict, info_path: str) -> None:
    """One Hub model into the shared folder, once, at its pinned revision (``params``: ``grid.download_params``;
    ``calibrl.model_store``)."""
    info = download(params["hf_id"], params["revision"], params["path"], info_path)
    log.info(
        "%s@%s (%s): %d files in %s",
        info["hf_id"],
        info["revision"],
        info["resolved_revision"],
        len(info["files"]),
        info["path"],
    )
