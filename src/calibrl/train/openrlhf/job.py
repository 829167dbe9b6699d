"""One paper-scale training job: the run's prompt file, its OpenRLHF command, the launch, and its metrics.

``train`` is what ``calibrl.pipeline.train_job`` calls for ``trainer: openrlhf``, inside the run's lock and
after ``calibrl.checkpoints.claim`` has stamped (or set aside) the run's checkpoints; the launcher resumes
from the last Hugging Face checkpoint and writes the per-checkpoint markers.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
from pathlib import Path

from calibrl import filtering
from calibrl.data.records import read_jsonl
from calibrl.io import write_text
from calibrl.layout import DEFAULTS, run_roles
from calibrl.train.openrlhf.data import LABEL_KEY, PROMPT_KEY, write_prompts

log = logging.getLogger("calibrl.openrlhf")


def openrlhf_run(settings: dict, layout: dict, data_path: str, rows: int, run_dir: str, models: dict) -> dict:
    """The plain dict ``calibrl.train.openrlhf.command.build_command`` takes, from a ``grid.train_params``
    slice and the run's GPU layout (``grid.layout_params``: ``calibrl.layout``); ``data_path`` is the run's
    prepared prompts, ``rows`` their number;
    ``models``: the folders rule download_model made (``policy``, and ``memory`` for DLC), which Ray actors
    read offline: never a Hub id, which every actor would fetch on a compute node."""
    method = {k: v for k, v in settings["method"].items() if k != "name"}
    lay = layout_of(layout)
    placement = run_roles(lay, method, settings["train"])["resources"]
    run = Path(run_dir).resolve()  # Ray actors run elsewhere: every path they get is absolute
    memory = settings.get("memory")
    if not models.get("policy") or (memory and not models.get("memory")):
        raise ValueError(f"{settings['run']}: the downloaded model folders are missing ({models}); rule download_model")
    return {
        "name": settings["run"],
        "model": str(Path(models["policy"]).resolve()),
        "memory_model": str(Path(models["memory"]).resolve()) if memory else None,
        "method": method,
        "seed": settings["seed"],
        "train": settings["train"],
        "data": {
            "train": str(Path(data_path).resolve()),
            "train_size": int(rows),
            "input_key": PROMPT_KEY,  # the template is already rendered into this field
            "label_key": LABEL_KEY,
            "prompt_template": "{problem}",
            "chat_template": False,  # rendered already (prepare_data), with enable_thinking
            "filtered_easiest": method["filter_easiest"],
        },
        "paths": {
            "ckpt_dir": str(run / "ckpt" / "openrlhf"),
            "log_dir": str(run / "tensorboard"),
            "marker_dir": str(run / "ckpt"),
        },
        "resources": placement,
    }


def layout_of(layout: dict) -> dict:
    """The run's effective layout (rule train's params: ``calibrl.layout.effective``), defaults filled in."""
    return {**DEFAULTS, **layout}


def prepare_data(
    settings: dict,
    train_path: str,
    out_path: str | Path,
    success_path: str | None = None,
    tokenizer=None,
    model_dir: str | None = None,
) -> int:
    """The run's training prompts for OpenRLHF, shuffled with the data seed (OpenRLHF's ``--data.max_samples``
    takes a prefix), the filtering baseline's queries removed by their success rates from ``rank_job``, and
    rendered through the model's chat template (``tokenizer``; loaded from the downloaded ``model_dir`` when
    ``chat_template`` is set and none is given) exactly as evaluation renders them. Returns the number of rows."""
    records = list(read_jsonl(train_path, on_error=settings["on_error"]))
    random.Random(f"train-order:{settings['data_seed']}").shuffle(records)
    if settings["chat_template"] and tokenizer is None:
        from transformers import AutoTokenizer

        if not model_dir:
            raise ValueError(
                f"{settings['run']}: chat_template needs the downloaded model folder (rule download_model)"
            )
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    share = settings["method"]["filter_easiest"]
    keep = None
    if share > 0:
        if not success_path:
            raise ValueError(
                f"method {settings['method']['name']!r} filters (filter_easiest > 0) but no success rates were given"
            )
        by_id = json.loads(Path(success_path).read_text())["rates"]
        missing = [r["id"] for r in records if r["id"] not in by_id]
        if missing:
            raise ValueError(f"{success_path}: no success rate for {len(missing)} training ids, e.g. {missing[:3]}")
        rates = [by_id[r["id"]] for r in records]
        keep = filtering.keep_indices(rates, share)
        log.info("filtering baseline: %s", filtering.summary(rates, keep))
    tokenizer = tokenizer if settings["chat_template"] else None
    return write_prompts(records, settings["template"], out_path, keep, tokenizer, settings["enable_thinking"])


def train(
    settings: dict,
    layout: dict,
    train_path: str,
    run_dir: str,
    models: dict,
    success_path: str | None = None,
    stop_at: int | None = None,
) -> None:
    """Launch OpenRLHF for one run (or one segment of it: up to step ``stop_at``, resuming from the last
    checkpoint) inside a private Ray cluster spanning the job's SLURM allocation. ``models``: the downloaded
    folders (policy, memory); the job and every Ray actor run offline (``HF_HUB_OFFLINE=1``), as compute nodes
    often are."""
    from calibrl.train.openrlhf.command import build_command

    os.environ["HF_HUB_OFFLINE"] = "1"  # inherited by ray_cluster.sh and the actors it starts
    data_path = Path(run_dir) / "train_prompts.jsonl"
    rows = prepare_data(settings, train_path, data_path, success_path, model_dir=models.get("policy"))
    run = openrlhf_run(settings, layout, str(data_path), rows, run_dir, models)
    run["stop_at"] = stop_at
    # Every run gets a Ray cluster of its own with token authentication (ray_cluster.sh), one node or several:
    # a bare ray.init() would start an open one. Inside the executor's job step SLURM_GPUS_ON_NODE is that
    # step's count, so the layout's GPUs per node are passed on.
    argv = ["bash", str(Path(__file__).with_name("ray_cluster.sh")), *build_command(run)]
    env = dict(os.environ)
    env["RAY_GPUS_PER_NODE"] = str(int(layout_of(layout)["gpus_per_node"]))
    log.info("launching: %s", " ".join(argv))
    subprocess.run(argv, check=True, env=env)


def metrics_job(run_dir: str, out_path: str) -> None:
    """Rule train_metrics: the run's TensorBoard scalars (every segment's) as its ``metrics.jsonl``."""
    tensorboard_metrics(str(Path(run_dir).resolve() / "tensorboard"), out_path)


# OpenRLHF 0.11.2's names for what the CPU trainer's metrics.jsonl calls otherwise. With --actor.entropy_coef 0
# the actor logs the token-mean policy entropy as "entropy_loss" (ppo_actor.py), which the tables read as entropy.
OPENRLHF_NAMES = {"entropy_loss": "entropy"}


def tensorboard_metrics(log_dir: str, out_path: str | Path) -> None:
    """OpenRLHF's training scalars (TensorBoard tags ``train/<name>``, as its TensorboardLogger writes them) as
    the project's metrics.jsonl, one line per step; its ``eval/`` scalars are not training metrics."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows: dict[int, dict] = {}
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if not tag.startswith("train/"):
                continue
            name = tag.removeprefix("train/")
            name = OPENRLHF_NAMES.get(name, name)
            for ev in acc.Scalars(tag):
                rows.setdefault(int(ev.step), {"step": int(ev.step)})[name] = float(ev.value)
    write_text(out_path, "".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
