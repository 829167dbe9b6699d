"""The project's MLflow store: a SQLite tracking database and an artifact folder under ``results/``.

MLflow is a derived view of the result files: only aggregation jobs write to it (SQLite has one
writer), and writing is idempotent. A run is identified by a stable key (tag ``calibrl.key``);
re-logging the same results reuses the run and adds nothing, because metrics carry deterministic
timestamps and MLflow skips identical rows. If the results changed, the old run is marked deleted
and replaced, so the UI never shows two runs for one key.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

KEY_TAG = "calibrl.key"
_TIMESTAMP_MS = 0  # deterministic: identical re-logs are deduplicated by the SQL store
_BATCH = 1000  # MLflow's log_batch limit on metrics per call

log = logging.getLogger(__name__)


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


class Store:
    """A handle on the project's tracking store (``store_dir/mlflow.db`` + ``store_dir/artifacts``)."""

    def __init__(self, store_dir: str | Path):
        self.dir = Path(store_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.uri = tracking_uri(self.dir)
        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        location = (self.dir / "artifacts" / name).resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def _find(self, exp_id: str, key: str):
        runs = self.client.search_runs([exp_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=10)
        return runs

    def _unchanged(self, run_id: str, record: RunRecord) -> bool:
        """True when the stored run already holds exactly ``record``'s params and metrics."""
        wanted: dict[str, set] = {}
        for k, v, s in record.metrics:
            wanted.setdefault(k, set()).add((s, float(v)))
        run = self.client.get_run(run_id)
        if run.data.params != {k: str(v)[:6000] for k, v in record.params.items()}:
            return False
        if set(run.data.metrics) != set(wanted):
            return False
        for k, points in wanted.items():
            have = {(m.step, float(m.value)) for m in self.client.get_metric_history(run_id, k)}
            if have != points:
                return False
        return True

    def upsert(self, experiment: str, record: RunRecord) -> str:
        """Create or update the run of ``record.key``; returns its run id."""
        # MLflow cannot store NaN/inf faithfully; a missing point is the honest record of "undefined".
        record.metrics = [(k, float(v), int(s)) for k, v, s in record.metrics if math.isfinite(float(v))]
        exp_id = self.experiment(experiment)
        existing = self._find(exp_id, record.key)
        run_id = None
        for run in existing:
            if run_id is None and self._unchanged(run.info.run_id, record):
                run_id = run.info.run_id
            else:
                log.info("replacing changed MLflow run %s (%s)", run.info.run_id, record.key)
                self.client.delete_run(run.info.run_id)
        if run_id is None:
            run_id = self.client.create_run(exp_id, run_name=record.name, tags={KEY_TAG: record.key}).info.run_id
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
        self.client.set_terminated(run_id)
        return run_id
