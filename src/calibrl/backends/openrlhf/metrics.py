"""A run's training metrics from OpenRLHF's TensorBoard scalars (every segment's), as the CPU trainer writes them."""

from __future__ import annotations

import json
from pathlib import Path

from calibrl.io import write_text

# OpenRLHF 0.11.2's names for what the CPU trainer's metrics call otherwise. With --actor.entropy_coef 0 the actor
# logs the token-mean policy entropy as "entropy_loss" (ppo_actor.py), which the tables read as entropy.
OPENRLHF_NAMES = {"entropy_loss": "entropy"}


def tensorboard_metrics(log_dir: str | Path, out_path: str | Path) -> None:
    """OpenRLHF's training scalars (TensorBoard tags ``train/<name>``, as its TensorboardLogger writes them) as
    JSON lines, one per step; its ``eval/`` scalars are not training metrics."""
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
