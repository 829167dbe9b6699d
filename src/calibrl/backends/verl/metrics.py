"""A run's training metrics from verl's file logger (``trainer.logger`` has ``file``): one JSON-lines file per
launch (``launch.METRICS``), each line ``{"step": k, "data": {name: value}}``, as the CPU trainer writes them.
A step a killed launch logged and its retry trained again is taken from the later launch (the files' names sort
by start time)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from calibrl.io import write_text

# verl 0.9.1's names for what the CPU trainer's metrics call otherwise: with entropy_coeff 0 and calculate_entropy
# the actor logs the token-mean policy entropy as actor/entropy
VERL_NAMES = {"actor/entropy": "entropy"}


def file_metrics(log_dir: str | Path, out_path: str | Path) -> None:
    """Every launch's scalars in ``log_dir`` as JSON lines, one per step, into ``out_path``."""
    rows: dict[int, dict] = {}
    for path in sorted(Path(log_dir).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            step = int(entry["step"])
            row = {"step": step}
            for name, value in entry["data"].items():
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    continue
                row[VERL_NAMES.get(name, name)] = float(value)
            rows[step] = row
    write_text(out_path, "".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
