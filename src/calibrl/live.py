"""MLflow while the grid runs: a process beside Snakemake logs each run's evaluations and training metrics as their
files appear, so the UI shows the runs and their curves long before rule grid_mlflow (which waits for the whole
grid) writes the final view.

Why a watcher on Snakemake's host, not logging from the jobs: the store is SQLite, and SQLite on a shared file
system written from many compute nodes is not safe. Snakemake runs on the login node (or this machine); this
process runs beside it, reads the result files the jobs write, and writes the store there, one upsert at a time
under the store's lock (:meth:`calibrl.tracking.Store.lock`), as the MLflow rules do. It logs what grid_mlflow
logs for the files that exist so far (:func:`calibrl.report.mlflow_view.run_records`), so the final sync extends the
same runs (the same run ids) rather than replacing them; a round that comes after a fuller log changes nothing.

A run is logged when one of its files changes: an evaluation, the base model's evaluation, a finished training
segment (its marker), its final training metrics. Training metrics before the run's last segment come from its
backend (the protocol's ``metrics``, as rule train_metrics reads them), so they move a segment at a time.

Started by the Snakefile's ``onstart`` (Snakemake runs hooks in its main process only, never in dry runs or in
SLURM's job steps), stopped by ``onsuccess``/``onerror``, and by itself once Snakemake is gone. Its log:
``results/logs/mlflow_live.log``. A failure here never fails the workflow: grid_mlflow still writes everything.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger("calibrl.live")

_WATCHER: subprocess.Popen | None = None


def start(spec: dict, spec_path: str, log_path: str) -> None:
    """Write ``spec`` (see :func:`watch`) to ``spec_path`` and start the watcher (the Snakefile's ``onstart``)."""
    global _WATCHER
    from calibrl.io import write_json

    write_json(spec_path, spec)
    cmd = [sys.executable, "-m", "calibrl.live", spec_path, str(os.getpid()), log_path]
    _WATCHER = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)


def stop(timeout: float = 60.0) -> None:
    """Stop the watcher after its current round (the Snakefile's ``onsuccess``/``onerror``)."""
    global _WATCHER
    if _WATCHER is None:
        return
    _WATCHER.send_signal(signal.SIGTERM)
    try:
        _WATCHER.wait(timeout)
    except subprocess.TimeoutExpired:
        _WATCHER.kill()
    _WATCHER = None


def _files(root: Path, run: dict) -> dict[str, int]:
    """The run's files that exist now -> their modification time (ns)."""
    folder = root / "runs" / run["run"]
    paths = [*run["evals"], run["base"], str(folder / "metrics.jsonl"), *map(str, folder.glob("ckpt/segment_*.done"))]
    return {p: os.stat(p).st_mtime_ns for p in paths if p and os.path.exists(p)}


def _training_so_far(folder: Path, run: str):
    """The run's training metrics so far, from its backend (as rule train_metrics reads them, via a temporary file);
    empty where they cannot be read yet (no settings, nothing logged, files mid-write)."""
    import pandas as pd

    from calibrl import backends, checkpoints
    from calibrl.runs import Run

    settings = folder / "settings.json"
    if not settings.is_file():
        return pd.DataFrame()
    try:
        with tempfile.TemporaryDirectory(prefix="calibrl-live-") as tmp:
            out = Path(tmp) / "metrics.jsonl"
            backends.get(checkpoints.RunStamp.read(settings).settings["backend"]).metrics(str(folder), str(out))
            rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    except Exception as err:  # noqa: BLE001 - the final sync logs them; this round goes on without
        log.debug("training metrics of %s not readable yet: %r", folder, err)
        return pd.DataFrame()
    r = Run.from_path(run)
    return pd.DataFrame(rows).assign(model=r.model, method=r.method, seed=r.seed) if rows else pd.DataFrame()


def log_round(spec: dict, seen: dict[str, dict]) -> int:
    """Log every run whose files changed since ``seen`` (updated in place); returns how many were logged."""
    from calibrl.tracking import Store, StoreError

    root = Path(spec["root"])
    changed = [(run, files) for run in spec["runs"] if (files := _files(root, run)) and files != seen.get(run["run"])]
    if not changed:
        return 0
    try:
        store = Store(spec["store"])
    except StoreError as err:  # locked by hand, corrupted: once per round, not once per run
        log.warning("MLflow live: %s; the next round retries", err)
        return 0
    logged = 0
    for run, files in changed:
        try:
            _log_run(spec, run, files, store)
        except Exception:  # noqa: BLE001 - one run's trouble (a file mid-write) neither stops the rest nor the grid
            log.exception("MLflow live: %s not logged this round; the next round retries, grid_mlflow logs it at "
                          "the end", run["run"])  # fmt: skip
            continue
        seen[run["run"]] = files
        logged += 1
    return logged


def _log_run(spec: dict, run: dict, files: dict[str, int], store) -> None:
    """Log one run (and the base model's run it starts from) from the files that exist now."""
    from calibrl.report import load as L
    from calibrl.report.mlflow_view import experiments, run_records

    root = Path(spec["root"])
    folder = root / "runs" / run["run"]
    final = folder / "metrics.jsonl"
    train = L.load_train_metrics([final], root) if final.is_file() else _training_so_far(folder, run["run"])
    evals = [p for p in (*run["evals"], run["base"]) if p in files]
    records = run_records(spec["grid"], L.load_evals(evals, root), train, root, spec["architectures"])
    done = final.is_file() and all(p in files for p in run["evals"])
    ids = {}
    for record in records:
        record.partial = True
        record.running = record.key == f"grid/{run['run']}" and not done
        ids[record.key] = store.upsert(experiments(spec["experiment"])["grid"], record)
    if f"grid/{run['run']}" not in ids:  # only the base model's evaluation so far: the run itself comes next round
        log.info("logged the base model's run of %s; the run has nothing logged yet", run["run"])
        return
    log.info("logged grid/%s as MLflow run %s: %d evaluations, %d training steps%s", run["run"],
             ids[f"grid/{run['run']}"], len(evals), len(train), "" if done else " (training)")  # fmt: skip


def watch(spec_path: str, parent: int, every: float = 10.0) -> None:
    """Log rounds until ``parent`` (Snakemake) is gone or SIGTERM arrives.

    ``spec``: root (the results folder), store, experiment, grid and architectures (rule grid_mlflow's params),
    runs ([{run: "model/method/sN", evals: [planned evaluation files], base: the base model's evaluation}]).
    ``every``: seconds between rounds."""
    spec = json.loads(Path(spec_path).read_text())
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    # what exists now was logged before, or is grid_mlflow's to log: this Snakemake's changes are the live view's
    seen = {run["run"]: _files(Path(spec["root"]), run) for run in spec["runs"]}
    while not stopping and os.getppid() == parent:
        try:
            log_round(spec, seen)
        except Exception:  # noqa: BLE001 - a broken round (store locked by hand, disk full) is retried
            log.exception("MLflow live round failed; the next round retries, grid_mlflow logs everything at the end")
        deadline = time.monotonic() + every
        while not stopping and os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.2)


if __name__ == "__main__":
    from calibrl.logs import setup

    setup(sys.argv[3])
    watch(sys.argv[1], int(sys.argv[2]))
