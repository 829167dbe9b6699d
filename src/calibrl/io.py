"""Atomic file output: every file the pipeline writes appears complete or not at all, and stays once written.

One writer, :func:`atomic_path`: the content goes to a hidden temporary file beside the target, is flushed to disk
(fsync), and is renamed onto the target (``os.replace``), whose directory is then synced too; a killed write
leaves only the temporary, which no reader trusts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``.

    The temporary file lives in the same directory so the final ``os.replace`` is atomic; on an
    exception (or a kill before the rename) only a ``.tmp`` file is left, which no rule trusts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if os.path.isfile(tmp):
            share(tmp)
        _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, path)
        _fsync(path.parent, os.O_RDONLY)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def umask() -> int:
    """The process's umask, read without changing it (Linux reports it in /proc; elsewhere set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share(path: str | Path) -> None:
    """Give a file made by ``tempfile`` (mode 0600, 0700 for a folder, whatever the umask) the mode a plain
    ``open`` or ``mkdir`` would: a collaborator in the group reads results where the user's umask allows it."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~umask())


def _fsync(path: str | Path, flags: int) -> None:
    """Flush ``path`` (a file, or a directory after a rename in it) to disk; best effort where a platform cannot
    open or sync a directory."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def outputs(folder: str | Path) -> list[Path]:
    """The complete files directly in ``folder``, sorted: hidden names are the temporaries of killed writes
    (:func:`atomic_path`), never outputs."""
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith("."))


def remove_temporaries(folder: str | Path) -> int:
    """Delete what killed writes left below ``folder``: the hidden ``.<name>.<random>.tmp`` files and folders
    of :func:`atomic_path` and ``calibrl.models.save`` and the ``.old`` folders of the latter. No reader
    trusts them, but a checkpoint-sized one per kill adds up. Only for a folder whose single writer is
    starting (a training job's run folder). Returns how many were removed."""
    found = sorted(
        (p for p in Path(folder).rglob(".*") if p.name.endswith((".tmp", ".old"))),
        key=lambda p: len(p.parts),  # parents first, so nothing inside a removed folder is visited
    )
    removed: list[Path] = []
    for p in found:
        if any(r in p.parents for r in removed):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return len(removed)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str, ensure_ascii=False) + "\n")


def write_csv(path: str | Path, frame) -> None:
    """CSV (gzip when the name ends in .gz), written atomically, without the index."""
    compression = "gzip" if str(path).endswith(".gz") else None
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, compression=compression, float_format="%.6g")


HTML_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>
body {{font-family: sans-serif; max-width: 75em; margin: 1em auto; line-height: 1.4}}
table {{border-collapse: collapse; margin: 0.5em 0}} th, td {{border: 1px solid #bbb; padding: 2px 6px}}
td {{text-align: right}} td:first-child, td:nth-child(2) {{text-align: left}} th {{background: #eee}}
</style></head><body>
{body}
</body></html>
"""


def write_markdown(path: str | Path, text: str) -> None:
    """``path`` (Markdown) and the same page as HTML beside it (``.html``), for the Snakemake report."""
    import markdown

    path = Path(path)
    write_text(path, text)
    body = markdown.markdown(text, extensions=["tables"])
    title = next((line.lstrip("# ") for line in text.splitlines() if line.startswith("#")), path.stem)
    write_text(path.with_suffix(".html"), HTML_PAGE.format(title=title, body=body))
