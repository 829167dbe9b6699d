"""Fetch a benchmark (or the training set) from the Hugging Face Hub, normalise it, and record what was fetched.

:func:`download` resolves the dataset revision to a commit sha (``HfApi().dataset_info``), downloads only
that commit's data files for the wanted config and split (``snapshot_download(revision=<sha>,
allow_patterns=[...])``), reads them with pyarrow / json (no ``datasets`` dependency), normalises the rows
with :mod:`calibrl.data.benchmarks`, writes the JSONL atomically (:func:`calibrl.data.records.write_jsonl`)
and then a manifest JSON, atomically too::

    {"key", "repo_id", "config", "split", "revision_requested", "revision" (the commit sha, None for
     local files), "origin" ("hub", "hf-cache" or "local_files"), "local_files",
     "files": [{"name", "sha256", "rows"}], "rows_read", "rows_written", "dropped": {reason: count},
     "jsonl": {"path", "sha256", "rows"}, "created_utc", "versions": {...}}

Which files: the dataset card's ``configs`` / ``data_files`` entry for the config and split when the
card has one (as ``datasets`` resolves it), else the spec's ``data_files`` patterns, else files whose
path names the split; a directory holding a single data file is taken as is.

Offline use:

* ``local_files`` (a parquet / json / jsonl file, or a directory such as a ``huggingface-cli download
  --local-dir`` copy) bypasses the Hub entirely: the config key ``grid.data.local_files.<key>``.
* With ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, the files are taken from the Hugging Face
  cache (``cache_dir``, default ``HF_HUB_CACHE``) if an earlier download (or a copied
  ``~/.cache/huggingface``) put them there; the branch -> sha mapping is read from the cache's ``refs``.
* Otherwise :class:`DataUnavailable` is raised at once -- metadata requests time out after
  :data:`HUB_TIMEOUT` seconds and nothing is retried -- with a message that says what to do.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from calibrl.data.benchmarks import BenchmarkSpec, Normalised, get_spec
from calibrl.data.records import DataError, write_jsonl
from calibrl.io import write_json, write_text

log = logging.getLogger(__name__)

__all__ = ["DATA_SUFFIXES", "HUB_TIMEOUT", "DataUnavailable", "download", "read_rows", "select_data_files"]

#: Seconds to wait for the Hub's metadata answers (env ``CALIBRL_HUB_TIMEOUT`` overrides); no retries.
HUB_TIMEOUT = float(os.environ.get("CALIBRL_HUB_TIMEOUT") or 5.0)
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
_SHA = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "true", "yes", "on"}


class DataUnavailable(RuntimeError):
    """The data set cannot be had here: no network (or offline mode), and no cached or local copy."""


# --------------------------------------------------------------------------------------------------
# Choosing and reading data files
# --------------------------------------------------------------------------------------------------


def _card_patterns(configs: Any, config: str | None, split: str) -> list[str] | None:
    """Glob patterns of ``split`` in the dataset card's ``configs`` entry for ``config``, or None."""
    if not isinstance(configs, list):
        return None
    wanted = config or "default"
    for entry in configs:
        if not isinstance(entry, Mapping) or entry.get("config_name", "default") != wanted:
            continue
        data_files = entry.get("data_files")
        if isinstance(data_files, Mapping):  # {split: pattern(s)}
            return [p for p in _listify(data_files.get(split)) if isinstance(p, str)]
        if isinstance(data_files, str | list) and all(isinstance(x, str) for x in _listify(data_files)):
            return _listify(data_files) if split == "train" else []  # bare patterns are the train split
        patterns: list[str] = []
        for item in _listify(data_files):
            if isinstance(item, Mapping) and item.get("split") == split:
                patterns += [p for p in _listify(item.get("path")) if isinstance(p, str)]
        return patterns
    return None


def _listify(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _matches(name: str, pattern: str) -> bool:
    """fnmatch (``*`` also crosses ``/``); a pattern naming a folder matches the files under it."""
    pattern = pattern[2:] if pattern.startswith("./") else pattern
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern.rstrip("/") + "/*")


def _is_data_file(name: str) -> bool:
    return name.lower().endswith(DATA_SUFFIXES) and not any(part.startswith(".") for part in name.split("/"))


def select_data_files(spec: BenchmarkSpec, filenames: Sequence[str], card_configs: Any = None) -> list[str]:
    """The data files (repo-relative posix paths, sorted) of ``spec``'s config and split among ``filenames``.

    Tried in order: the dataset card's ``configs`` entry (``card_configs``, the card's YAML ``configs``
    list); the spec's ``data_files`` patterns; data files whose path names the split (``test.jsonl``,
    ``data/test-00000-of-00001.parquet``, ``test/0000.parquet``, under the config's folder if the config
    is not ``default``); the only data file if there is exactly one. Empty if nothing fits.
    """
    data = sorted(n for n in filenames if _is_data_file(n))
    patterns = _card_patterns(card_configs, spec.config, spec.split)
    if patterns:
        chosen = [n for n in data if any(_matches(n, p) for p in patterns)]
        if chosen:
            return chosen
    chosen = [n for n in data if any(_matches(n, p) for p in spec.data_files)]
    if chosen:
        return chosen
    token = re.compile(rf"(^|[/_.-]){re.escape(spec.split)}([/_.-]|$)")
    chosen = [n for n in data if token.search(n)]
    if spec.config not in (None, "default"):
        chosen = [n for n in chosen if spec.config in PurePosixPath(n).parts[:-1]]
    if chosen:
        return chosen
    return data if len(data) == 1 else []


def _read_json_lines(path: Path, text: str) -> list:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise DataError(f"{path}:{lineno}: invalid JSON: {exc}") from exc
    return rows


def read_rows(path: str | Path) -> list:
    """The rows of one data file: parquet (pyarrow), JSON lines, or a JSON array (or an object holding
    one list, e.g. ``{"data": [...]}``; a ``.json`` file of JSON lines works too). Rows are returned as
    parsed; the normalisers drop (and count) rows that are not objects."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise DataError(f"{path}: cannot read parquet: {exc}") from exc
    if suffix not in (".json", ".jsonl"):
        raise DataError(f"{path}: not a data file (expected one of {', '.join(DATA_SUFFIXES)})")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8: {exc}") from exc
    if suffix == ".jsonl":
        return _read_json_lines(path, text)
    try:
        doc = json.loads(text)
    except ValueError:
        return _read_json_lines(path, text)  # JSON lines in a .json file
    if isinstance(doc, list):
        return doc
    if isinstance(doc, Mapping):
        lists = [v for v in doc.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
        return [doc]
    raise DataError(f"{path}: expected a JSON array of rows, got {type(doc).__name__}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _list_files(root: Path) -> list[str]:
    """Files under ``root`` (following the cache's symlinks), as sorted root-relative posix paths."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        rel = Path(dirpath).relative_to(root)
        out += [(rel / f).as_posix() for f in filenames if not f.startswith(".")]
    return sorted(out)


def _readme_configs(readme: Path) -> Any:
    """The ``configs`` list of a dataset card's YAML front matter, or None."""
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not match:
        return None
    import yaml

    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    return meta.get("configs") if isinstance(meta, dict) else None


# --------------------------------------------------------------------------------------------------
# The Hub and its cache
# --------------------------------------------------------------------------------------------------


def _offline_requested() -> bool:
    from huggingface_hub import constants

    env = (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").strip().lower()
    return env in _TRUE or bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _connection_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the Hub cannot be reached" (across huggingface_hub's HTTP backends)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    errors: list[type[BaseException]] = [OSError, TimeoutError, OfflineModeIsEnabled, HfHubHTTPError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "RequestException")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _definitive_errors() -> tuple[type[BaseException], ...]:
    """Hub answers that no cache can fix: the repo or revision does not exist, or access is refused."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    return (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError)


def _cache_root(cache_dir: str | Path | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()


def _storage_folder(cache_dir: str | Path | None, repo_id: str) -> Path:
    """The cache folder of a dataset repo (huggingface_hub's documented cache layout)."""
    return _cache_root(cache_dir) / ("datasets--" + repo_id.replace("/", "--"))


def _remember_ref(cache_dir: str | Path | None, repo_id: str, revision: str, sha: str) -> None:
    """Record ``revision -> sha`` in the cache's ``refs`` (best effort), so that a later offline call
    with the same branch or tag finds the snapshot we downloaded by sha."""
    if revision == sha:
        return
    ref = _storage_folder(cache_dir, repo_id) / "refs" / revision
    try:
        if ref.is_file() and ref.read_text().strip() == sha:
            return
        write_text(ref, sha)
    except OSError as exc:
        log.warning("could not record %s -> %s in the HF cache: %s", revision, sha, exc)


def _how_to_fix(spec: BenchmarkSpec) -> str:
    return (
        f"To fix it, either pre-seed the Hugging Face cache on a machine with network access "
        f"(`huggingface-cli download --repo-type dataset {spec.repo_id}`, or `hf download {spec.repo_id} "
        f"--repo-type dataset`) and copy its ~/.cache/huggingface (or $HF_HOME) to this machine, or set the "
        f"config key grid.data.local_files.{spec.key} to a local copy (a parquet/json/jsonl file or a "
        f"directory of them)."
    )


def _unavailable(spec: BenchmarkSpec, revision: str | None, cache_dir: Any, reason: str) -> DataUnavailable:
    where = f"config {spec.config or 'default'}, split {spec.split}, revision {revision or 'main'}"
    return DataUnavailable(
        f"{spec.key}: cannot get the Hugging Face dataset {spec.repo_id} ({where}): {reason}; "
        f"and the Hugging Face cache ({_cache_root(cache_dir)}) holds no usable copy. {_how_to_fix(spec)}"
    )


def _from_hub(spec: BenchmarkSpec, revision: str | None, cache_dir: Any) -> tuple[Path, str, list[str]]:
    """Resolve the sha and download the split's files: (snapshot folder, sha, files)."""
    from huggingface_hub import HfApi, snapshot_download

    info = HfApi().dataset_info(spec.repo_id, revision=revision, timeout=HUB_TIMEOUT)
    sha = info.sha
    if not sha:
        raise DataError(f"{spec.key}: the Hub returned no commit sha for {spec.repo_id}@{revision or 'main'}")
    card = info.card_data
    configs = card.get("configs") if card is not None and hasattr(card, "get") else None
    siblings = [s.rfilename for s in (info.siblings or [])]
    files = select_data_files(spec, siblings, configs)
    if not files:
        raise DataError(
            f"{spec.key}: no data files for config {spec.config or 'default'} / split {spec.split} in "
            f"{spec.repo_id}@{sha}; the repo holds: {', '.join(siblings) or 'nothing'}"
        )
    allow = files + (["README.md"] if "README.md" in siblings else [])
    folder = snapshot_download(
        repo_id=spec.repo_id,
        repo_type="dataset",
        revision=sha,
        allow_patterns=allow,
        cache_dir=cache_dir,
        etag_timeout=HUB_TIMEOUT,
    )
    _remember_ref(cache_dir, spec.repo_id, revision or "main", sha)
    return Path(folder), sha, files


def _from_cache(spec: BenchmarkSpec, revision: str | None, cache_dir: Any, reason: str) -> tuple[Path, str, list[str]]:
    """The split's files from the HF cache, without network: (snapshot folder, sha, files)."""
    from huggingface_hub import snapshot_download

    storage = _storage_folder(cache_dir, spec.repo_id)
    wanted = revision or "main"
    sha: str | None = wanted if _SHA.fullmatch(wanted) else None
    if sha is None:
        ref = storage / "refs" / wanted
        sha = ref.read_text().strip() if ref.is_file() else None
    if sha is None or not (storage / "snapshots" / sha).is_dir():
        raise _unavailable(spec, revision, cache_dir, reason)
    folder = storage / "snapshots" / sha
    files = select_data_files(spec, _list_files(folder), _readme_configs(folder / "README.md"))
    if not files:
        raise _unavailable(spec, revision, cache_dir, f"{reason} (the cached snapshot {sha} has no data files for it)")
    try:  # let huggingface_hub check the cached snapshot is complete for these files
        snapshot_download(
            repo_id=spec.repo_id,
            repo_type="dataset",
            revision=sha,
            allow_patterns=files,
            cache_dir=cache_dir,
            local_files_only=True,
        )
    except _connection_errors() as exc:  # LocalEntryNotFoundError and IncompleteSnapshotError are OSErrors
        raise _unavailable(spec, revision, cache_dir, f"{reason} (cache: {type(exc).__name__}: {exc})") from exc
    return folder, sha, files


def _from_local(spec: BenchmarkSpec, local_files: str | Path) -> tuple[Path, list[str]]:
    """(root, files) for a user-supplied file or directory."""
    path = Path(local_files).expanduser()
    if path.is_file():
        if not _is_data_file(path.name):
            raise DataError(f"{spec.key}: local_files {path} is not a {'/'.join(DATA_SUFFIXES)} file")
        return path.parent, [path.name]
    if path.is_dir():
        names = _list_files(path)
        files = select_data_files(spec, names, _readme_configs(path / "README.md"))
        if not files:
            found = [n for n in names if _is_data_file(n)]
            raise DataError(
                f"{spec.key}: no data files for split {spec.split} under local_files {path}; found: "
                f"{', '.join(found) or 'no parquet/json/jsonl files'}"
            )
        return path, files
    raise DataUnavailable(
        f"{spec.key}: local_files {path} (config key grid.data.local_files.{spec.key}) does not exist. "
        f"{_how_to_fix(spec)}"
    )


# --------------------------------------------------------------------------------------------------
# download
# --------------------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    out = {}
    for name in ("huggingface_hub", "pyarrow"):
        try:
            out[name] = importlib.import_module(name).__version__
        except (ImportError, AttributeError):
            pass
    return out


def _drop_unparseable_golds(key: str, records: Normalised, out_path: Path, on_error: str) -> Normalised:
    """Records whose gold answer math-verify cannot parse (it could never grade them), checked in grading
    worker processes (a pathological gold cannot hang the job); fail or drop them as ``on_error`` says."""
    from calibrl.grading import gold_problems

    bad = gold_problems([r["answer"] for r in records])
    if not bad:
        return records
    where = [f"{out_path}:{i + 1} (id {records[i]['id']}): {why}" for i, why in bad.items()]
    summary = f"{key}: {len(bad)} gold answers math-verify cannot parse (grid.data.on_error is {on_error})"
    if on_error == "fail":
        raise DataError(summary + ":\n  " + "\n  ".join(where[:20]))
    log.warning("%s; dropped:\n  %s", summary, "\n  ".join(where[:20]))
    kept = set(range(len(records))) - set(bad)
    dropped = {**records.dropped, "unparseable_gold": len(bad)}
    return Normalised([r for i, r in enumerate(records) if i in kept], dropped, records.n_raw)


def download(
    key: str,
    out_path: str | Path,
    manifest_path: str | Path,
    revision: str | None = None,
    cache_dir: str | None = None,
    local_files: str | None = None,
    on_error: str = "fail",
    check_golds: bool = True,
    subset: int | None = None,
    seed: int = 0,
) -> dict:
    """Fetch ``key``'s split (see :data:`calibrl.data.benchmarks.BENCHMARKS`), write it as records to
    ``out_path`` and a manifest to ``manifest_path`` (both atomically); return the manifest.

    ``revision`` is a branch, tag or commit sha (default: the default branch); the manifest records the
    commit sha it resolved to. ``cache_dir`` is the Hugging Face cache (default ``HF_HUB_CACHE``).
    ``local_files`` (a data file or a directory) skips the Hub. Raises :class:`DataUnavailable` when
    the Hub cannot be reached (or ``HF_HUB_OFFLINE=1``) and no cached copy exists, and
    :class:`~calibrl.data.records.DataError` when the files are there but unusable. Gold answers that
    math-verify cannot parse (``check_golds``) fail the download or, with ``on_error="skip"``, are dropped
    and counted in the manifest as ``unparseable_gold``. ``subset`` keeps that many records, drawn with
    ``seed``, in their order (a smoke run's small data).
    """
    spec = get_spec(key)
    out_path, manifest_path = Path(out_path), Path(manifest_path)
    sha: str | None = None
    if local_files is not None:
        root, files = _from_local(spec, local_files)
        origin = "local_files"
    elif _offline_requested():
        root, sha, files = _from_cache(spec, revision, cache_dir, "offline mode is on (HF_HUB_OFFLINE)")
        origin = "hf-cache"
    else:
        try:
            root, sha, files = _from_hub(spec, revision, cache_dir)
            origin = "hub"
        except _definitive_errors() as exc:
            raise _unavailable(spec, revision, cache_dir, f"{type(exc).__name__}: {exc}") from exc
        except _connection_errors() as exc:
            log.warning("%s: the Hub cannot be reached (%s: %s); trying the cache", key, type(exc).__name__, exc)
            reason = f"the Hub cannot be reached ({type(exc).__name__}: {exc})"
            try:
                root, sha, files = _from_cache(spec, revision, cache_dir, reason)
            except DataUnavailable as unavailable:
                raise unavailable from exc
            origin = "hf-cache"

    file_info, rows = [], []
    for name in files:
        path = root / name
        file_rows = read_rows(path)
        file_info.append({"name": name, "sha256": _sha256(path), "rows": len(file_rows)})
        rows += file_rows
    records = spec.normalise(rows)
    if check_golds:
        records = _drop_unparseable_golds(key, records, out_path, on_error)
    if not records:
        raise DataError(f"{key}: no usable rows in {', '.join(files)} (dropped: {records.dropped})")
    if subset is not None and len(records) > subset:
        keep = sorted(random.Random(seed).sample(range(len(records)), subset))
        records = Normalised([records[i] for i in keep], records.dropped, records.n_raw)
    n_written = write_jsonl(out_path, records)
    manifest = {
        "key": key,
        "repo_id": spec.repo_id,
        "config": spec.config,
        "split": spec.split,
        "revision_requested": revision,
        "revision": sha,
        "origin": origin,
        "local_files": str(Path(local_files).expanduser().resolve()) if local_files is not None else None,
        "files": file_info,
        "rows_read": records.n_raw,
        "rows_written": n_written,
        "subset": subset,
        "dropped": records.dropped,
        "jsonl": {"path": str(out_path), "sha256": _sha256(out_path), "rows": n_written},
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
    }
    write_json(manifest_path, manifest)
    log.info("%s: wrote %d records to %s (%s, revision %s)", key, n_written, out_path, origin, sha)
    return manifest
