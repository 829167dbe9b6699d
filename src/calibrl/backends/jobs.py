"""The jobs of rules warmstart, train, train_metrics and evaluate, for every backend: the run's ``settings.json`` says
which (rule warmstart's, which precedes the runs: the grid's ``trainer``)."""

from __future__ import annotations

import logging
from pathlib import Path

from calibrl import backends, checkpoints
from calibrl.checkpoints import RunStamp
from calibrl.io import write_json
from calibrl.runs import checkpoint_steps

log = logging.getLogger("calibrl.backends")


def warmstart_job(trainer: str, params: dict, sft_path: str, model_dir: str, info_path: str, threads: int = 1) -> None:
    """Rule warmstart's job: the starting model that backend ``trainer`` makes from supervised data."""
    backends.get(trainer).warmstart(params, sft_path, model_dir, info_path, threads)


def train_job(settings_path: str, stop_at: int, marker: str, threads: int = 1, workers: int = 1) -> None:
    """Train the run of ``settings_path`` up to step ``stop_at`` under the run's lock, resuming from its last
    checkpoint when that was made with the same settings and inputs (``calibrl.checkpoints.claim``), then write
    ``marker`` (JSON: the segment's end, its checkpoints' steps, the fingerprint) that evaluations wait for."""
    stamp = RunStamp.read(settings_path)
    run_dir = Path(settings_path).parent
    backend = backends.get(stamp.backend)
    with checkpoints.run_lock(run_dir):
        checkpoints.claim(run_dir, stamp)
        backend.train(str(settings_path), int(stop_at), threads, workers)
    steps = checkpoint_steps(stamp.train["eval_every"], stop_at)
    write_json(marker, {"end": int(stop_at), "steps": steps, "fingerprint": stamp.fingerprint})


def metrics_job(settings_path: str, out_path: str) -> None:
    """The run's training metrics as ``metrics.jsonl`` once its last segment has trained (rule train_metrics)."""
    backends.get(RunStamp.read(settings_path).backend).metrics(str(Path(settings_path).parent), out_path)


def evaluate_job(
    params: dict,
    settings_path: str,
    markers: list[str],
    split_paths: dict[str, str],
    out_paths: list[str],
    steps: list[int],
    threads: int = 1,
    workers: int = 1,
    retention: dict | None = None,
) -> None:
    """Rule evaluate's job (``calibrl.evaluate.evaluate_job``), with the run's backend removing each checkpoint once
    evaluated where ``retention`` (``grid.retention``) says so (its GPU side's ``release``; a backend without one
    never removes any)."""
    from calibrl.evaluate import evaluate_job as evaluate

    release = None
    removes = retention and retention["remove_evaluated"]
    gpu = backends.get(RunStamp.read(settings_path).backend).gpu if removes else None
    if gpu is not None:
        keep = list(retention["keep_steps"])

        def release(policy: str, step: int) -> bool:
            return gpu.release(policy, step, keep)

    evaluate(params, settings_path, markers, split_paths, out_paths, steps, threads, workers, release=release)
