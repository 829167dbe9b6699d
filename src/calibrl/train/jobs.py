"""The training rules' jobs: a tiny model's warm start, and a run itself (the CPU trainer or the OpenRLHF
launcher), under the run's lock and against its settings stamp (``calibrl.checkpoints``, which also makes
the stamp: rule run_settings, kept free of torch so that its 16 small jobs start in half a second)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.data.records import read_jsonl
from calibrl.io import write_json

log = logging.getLogger("calibrl.train.jobs")


def warmstart_job(params: dict, train_path: str, model_dir: str, info_path: str, threads: int = 1) -> None:
    """Supervised warm start of a tiny model (``params``: ``grid.warmstart_params``)."""
    from calibrl.train.warmstart import warmstart

    torch.set_num_threads(max(1, int(threads)))  # Snakemake runs jobs side by side
    ws = params["warmstart"]
    records = read_jsonl(train_path, on_error=params["on_error"])
    info = warmstart(
        records, params["arch"], ws["steps"], ws["batch_size"], ws["lr"], params["seed"], params["template"], model_dir
    )
    write_json(info_path, {**info, "model": params["model"], "path": str(Path(model_dir).resolve())})


def train_job(
    settings_path: str,
    run_dir: str,
    train_path: str,
    steps: int | None = None,
    init_info: str | None = None,
    memory_info: str | None = None,
    success_path: str | None = None,
    layout: dict | None = None,
    segment: tuple[int, str] | None = None,
    threads: int = 1,
    workers: int = 1,
) -> None:
    """Train one run to ``train.steps`` under the run's lock, resuming from its last checkpoint when that was
    made with the same settings and inputs (``settings_path``: its ``settings.json``; ``calibrl.checkpoints``).

    ``init_info``/``memory_info``: the info files of the warm starts (tiny models) or, at paper scale, of the
    login node's downloads (rule download_model); ``steps``: the run's length; ``success_path``: at paper scale, the
    filtering baseline's success rates (``rank_job``); ``layout``: the paper-scale GPU layout; ``segment``: at
    paper scale (end step, marker path), train up to that step only and then write the marker (JSON: the end,
    its checkpoints' steps, the fingerprint)."""
    stamp = json.loads(Path(settings_path).read_text())
    settings = stamp["settings"]
    # steps: the run's length (calibrl.grid.run_length), outside the CPU trainer's stamp
    length = {"steps": steps} if steps is not None else {}
    settings = {**settings, "train": {**settings["train"], **length}}
    if "steps" not in settings["train"]:
        raise ValueError(f"{settings_path}: the run's length is not in its settings; pass steps (rule train's params)")
    with checkpoints.run_lock(run_dir):
        checkpoints.claim(run_dir, stamp)
        if settings["trainer"] == "openrlhf":
            from calibrl.train.openrlhf.job import train

            models = {
                "policy": checkpoints.model_dir(init_info),
                "memory": checkpoints.model_dir(memory_info),
            }  # the downloads
            end = int(segment[0]) if segment else int(settings["train"]["steps"])
            train(settings, layout or {}, train_path, run_dir, models, success_path, stop_at=end)
            if segment:
                steps = G.checkpoint_steps(settings["train"]["eval_every"], end)
                write_json(segment[1], {"end": end, "steps": steps, "fingerprint": stamp["fingerprint"]})
            return
        from calibrl.tasks import Scorer
        from calibrl.train.local import Trainer

        torch.set_num_threads(max(1, int(threads)))
        records = read_jsonl(train_path, on_error=settings["on_error"])
        with Scorer(workers=workers) as scorer:
            Trainer(
                G.Method(**{k: v for k, v in settings["method"].items() if k != "name"}),
                G.TrainSettings.from_config(settings["train"]),
                records,
                checkpoints.model_dir(init_info),
                run_dir,
                scorer,
                seed=settings["seed"],
                memory_dir=checkpoints.model_dir(memory_info),
                template=settings["template"],
            ).run()
