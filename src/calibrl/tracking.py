"""The project's MLflow store: a SQLite tracking database and an artifact folder under ``results/``.

MLflow is a derived view of the result files, written on the host Snakemake runs on only (SQLite on a shared
file system is not safe to write from many nodes): by the MLflow rules and by the live view beside Snakemake
(``calibrl.live``), one at a time (:meth:`Store.lock`). Writing is idempotent. A run is identified by a stable key
(tag ``calibrl.key``); re-logging the same results reuses the run and adds nothing, because metrics carry
deterministic timestamps and MLflow skips identical rows, and a run logged while it trained is extended by its
later points. If the results changed (a stored point the new results lack, other settings, another start), the old
run is marked deleted and replaced, so the UI never shows two runs for one key.

A store that cannot be used (its folder is a file, its database locked by another writer or not a
SQLite database) raises ``StoreError`` naming the file and what to do, before anything is written; the
result files the store is built from are never touched, so moving a broken store aside and rerunning the
MLflow rule rebuilds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

KEY_TAG = "calibrl.key"
EXPERIMENT_KIND = "mlflow.experimentKind"
_TIMESTAMP_MS = 0  # deterministic: identical re-logs are deduplicated by the SQL store
_BATCH = 1000  # MLflow's log_batch limit on metrics per call

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """The tracking store cannot be used; the message names the file and the remedy."""


def tracking_uri(store_dir: str | Path) -> str:
    return f"sqlite:///{(Path(store_dir) / 'mlflow.db').resolve()}"


@dataclass
class RunRecord:
    """Everything one MLflow run holds; built from result files by the caller."""

    key: str
    name: str
    params: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    metrics: list[tuple[str, float, int]] = field(default_factory=list)  # (key, value, step)
    artifacts: list[tuple[Path, str]] = field(default_factory=list)  # (local file, artifact dir)
    start_ms: int | None = None  # the run's real start and end (ms since the epoch), where the results know them
    end_ms: int | None = None
    running: bool = False  # still training: the UI shows it running
    partial: bool = False  # built from the files that exist so far (calibrl.live): never replaces a run holding more


def flatten(tree: dict, prefix: str) -> dict:
    """Nested config -> {"prefix.a.b": leaf} for MLflow params; lists stay whole (params are strings)."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        flat.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return flat


def check_database(db: Path, lock_timeout: float = 30.0) -> None:
    """Raise ``StoreError`` if ``db`` is not a readable, writable SQLite database (checked without writing)."""
    remedy = "the result files are intact: move the store aside and rerun the MLflow rules to rebuild it"
    try:
        con = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=lock_timeout)
    except sqlite3.Error as err:
        raise StoreError(f"MLflow store {db} cannot be opened for writing ({err}); check its permissions") from err
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if con.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise sqlite3.DatabaseError("quick_check failed")
        con.execute("BEGIN IMMEDIATE")  # takes the write lock, so a busy writer shows up here, not mid-sync
        con.rollback()
    except sqlite3.OperationalError as err:
        if "locked" in str(err) or "busy" in str(err):
            raise StoreError(
                f"MLflow store {db} is locked by another process (waited {lock_timeout:g} s): another aggregation "
                "or a program writing to it is running; rerun when it has finished"
            ) from err
        raise StoreError(f"MLflow store {db} cannot be used ({err}); {remedy}") from err
    except sqlite3.DatabaseError as err:
        raise StoreError(f"MLflow store {db} is corrupted ({err}); {remedy}") from err
    finally:
        con.close()


def relocate(db: Path, artifacts: Path) -> int:
    """Point the store's artifact locations at ``artifacts`` when the store was moved or copied with its results
    folder (MLflow records absolute locations: a moved store would read, and write, the original's artifacts).
    Every experiment this module made lives at ``{artifacts}/{name}``, each run under its experiment. Returns how
    many experiments were moved."""
    root = artifacts.resolve().as_uri()
    con = sqlite3.connect(db, timeout=30)
    try:
        moved = 0
        with con:
            for name, location in con.execute("SELECT name, artifact_location FROM experiments").fetchall():
                leaf = (Path("/") / name).as_uri()[len("file://") :]  # "/<name>", quoted as a location quotes it
                if not location or not location.endswith(leaf) or location[: -len(leaf)] == root:
                    continue  # not one of ours (MLflow's Default), or in place
                old = location[: -len(leaf)]
                con.execute("UPDATE experiments SET artifact_location = ? WHERE name = ?", (root + leaf, name))
                con.execute(
                    "UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE substr(artifact_uri, 1, ?) = ?",
                    (root, len(old) + 1, len(old), old),
                )
                moved += 1
    finally:
        con.close()
    if moved:
        log.info("MLflow store %s was moved: its artifact locations now point at %s", db, artifacts)
        # MLflow caches each run's artifact place per process (by run id): forget the old places
        from mlflow.tracking._tracking_service import utils as service

        getattr(service, "_artifact_repos_cache", {}).clear()
    return moved


class Store:
    """A handle on the project's tracking store (``store_dir/mlflow.db`` + ``store_dir/artifacts``)."""

    def __init__(self, store_dir: str | Path, must_exist: bool = False, lock_timeout: float = 30.0):
        """``must_exist``: for readers (a missing store is an error, not a new empty one).
        ``lock_timeout``: seconds to wait for another writer before giving up."""
        self.dir = Path(store_dir)
        self.db = self.dir / "mlflow.db"
        if self.dir.exists() and not self.dir.is_dir():
            raise StoreError(f"MLflow store {self.dir} is a file, not a folder; move it aside and rerun")
        if must_exist and not self.db.is_file():
            raise StoreError(
                f"MLflow store {self.db} does not exist: run the workflow (or `snakemake --forcerun grid_mlflow "
                "toy_mlflow`) to build it from the result files"
            )
        if self.db.exists():
            check_database(self.db, lock_timeout)
            relocate(self.db, self.dir / "artifacts")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.uri = tracking_uri(self.dir)
        self.client = MlflowClient(tracking_uri=self.uri)

    @contextlib.contextmanager
    def lock(self):
        """Hold the store's writer lock (``store_dir/.writer.lock``) for one upsert: the MLflow rules and the live
        view (separate processes) never interleave on one run, and none waits out SQLite's busy timeout."""
        with open(self.dir / ".writer.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield self
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        location = (self.dir / "artifacts" / name).resolve().as_uri()
        # Marks the experiment as model training, so the UI opens on the runs and charts, not the GenAI view.
        return self.client.create_experiment(
            name, artifact_location=location, tags={EXPERIMENT_KIND: "custom_model_development"}
        )

    def _find(self, exp_id: str, key: str):
        if "'" in key and '"' in key:  # MLflow's filter language has no escape for a quote inside a string
            raise ValueError(f"MLflow run key {key!r} holds both kinds of quote: it cannot be searched for")
        quote = '"' if "'" in key else "'"
        return self.client.search_runs(
            [exp_id], filter_string=f"tags.`{KEY_TAG}` = {quote}{key}{quote}", max_results=10
        )

    def _compare(self, run_id: str, record: RunRecord) -> str:
        """How the stored run stands to ``record``: "part" (the same params and start, every stored metric point one
        of ``record``'s: an earlier part of it, or all of it), "more" (the same, but ``record``'s points all stored
        and more besides) or "other" (other results)."""
        wanted: dict[str, set] = {}
        for k, v, s in record.metrics:
            wanted.setdefault(k, set()).add((s, float(v)))
        run = self.client.get_run(run_id)
        if run.data.params != {k: str(v)[:6000] for k, v in record.params.items()}:
            return "other"
        if record.start_ms is not None and run.info.start_time != record.start_ms:
            return "other"  # another training of the same key
        have = {
            k: {(m.step, float(m.value)) for m in self.client.get_metric_history(run_id, k)} for k in run.data.metrics
        }
        if all(points <= wanted.get(k, set()) for k, points in have.items()):
            return "part"
        if all(points <= have.get(k, set()) for k, points in wanted.items()):
            return "more"
        return "other"

    def prune(self, experiment: str, keep: set[str]) -> list[str]:
        """Mark deleted every run of ``experiment`` whose key is not in ``keep`` (results that no longer exist: a
        deleted run folder, a method dropped from the grid); returns their keys. The store keeps them as MLflow
        keeps deleted runs, out of the UI's lists."""
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            return []
        gone = []
        with self.lock():
            for run in self.client.search_runs([exp.experiment_id], max_results=50_000):
                key = run.data.tags.get(KEY_TAG)
                if key is not None and key not in keep:
                    self.client.delete_run(run.info.run_id)
                    gone.append(key)
        if gone:
            log.info("MLflow runs whose results are gone, marked deleted: %s", ", ".join(sorted(gone)))
        return gone

    def upsert(self, experiment: str, record: RunRecord) -> str:
        """Create or update the run of ``record.key``; returns its run id."""
        # MLflow cannot store NaN/inf faithfully; a missing point is the honest record of "undefined".
        record.metrics = [(k, float(v), int(s)) for k, v, s in record.metrics if math.isfinite(float(v))]
        with self.lock():
            return self._upsert(experiment, record)

    def _upsert(self, experiment: str, record: RunRecord) -> str:
        exp_id = self.experiment(experiment)
        existing = self._find(exp_id, record.key)
        run_id = None
        for run in existing:
            stands = self._compare(run.info.run_id, record) if run_id is None else "other"
            if stands == "more" and record.partial:  # a live view's round that came after a fuller log
                return run.info.run_id
            if stands == "part":
                run_id = run.info.run_id
            else:
                log.info("replacing changed MLflow run %s (%s)", run.info.run_id, record.key)
                self.client.delete_run(run.info.run_id)
        if run_id is None:
            run_id = self.client.create_run(
                exp_id, start_time=record.start_ms, run_name=record.name, tags={KEY_TAG: record.key}
            ).info.run_id
        tags = [RunTag(k, str(v)) for k, v in {**record.tags, KEY_TAG: record.key}.items()]
        params = [Param(k, str(v)[:6000]) for k, v in record.params.items()]
        metrics = [Metric(k, float(v), _TIMESTAMP_MS, int(s)) for k, v, s in record.metrics]
        self.client.log_batch(run_id, params=params[:100], tags=tags)
        for i in range(100, len(params), 100):
            self.client.log_batch(run_id, params=params[i : i + 100])
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(run_id, metrics=metrics[i : i + _BATCH])
        for path, artifact_dir in record.artifacts:
            self.client.log_artifact(run_id, str(path), artifact_path=artifact_dir)
        if record.running:
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.client.set_terminated(run_id, end_time=record.end_ms)
        return run_id
