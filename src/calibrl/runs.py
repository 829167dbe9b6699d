"""A run's name and folder, and which of its steps have a checkpoint: the conventions every layer shares.

``results/runs/{model}/{method}/s{seed}/`` holds ``settings.json`` (the run's identity, ``calibrl.checkpoints``),
``ckpt/`` (checkpoints, ``step_{k}.done`` markers, ``segment_{end}.done``), ``eval/step_{k}.json`` and
``metrics.jsonl``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RUN_PATH = re.compile(r"(?:^|/)(?P<model>[^/]+)/(?P<method>[^/]+)/s(?P<seed>\d+)(?:/|$)")


@dataclass(frozen=True)
class Run:
    model: str
    method: str
    seed: int

    @property
    def path(self) -> str:
        """The run's folder under ``{results}/runs/``; :meth:`from_path` is its inverse."""
        return f"{self.model}/{self.method}/s{self.seed}"

    @classmethod
    def from_path(cls, path: str) -> Run:
        """The run a result file belongs to, from any path below ``runs/`` (``.../runs/m/meth/s0/eval/x.json``)."""
        text = str(path).replace("\\", "/")
        tail = text.rsplit("/runs/", 1)[-1] if "/runs/" in text else text.removeprefix("runs/")
        m = _RUN_PATH.match(tail)
        if not m:
            raise ValueError(f"{path}: not inside a run folder runs/{{model}}/{{method}}/s{{seed}}/")
        return cls(m["model"], m["method"], int(m["seed"]))


def checkpoint_steps(eval_every: int, up_to: int) -> list[int]:
    """The one rule for which steps have a checkpoint (and are evaluated): ``eval_every, 2 eval_every, ...`` up to
    and including ``up_to``."""
    return list(range(int(eval_every), int(up_to) + 1, int(eval_every)))


def marker_of(eval_path: str) -> str:
    """The marker of the checkpoint an evaluation file is of: ``runs/<run>/eval/step_k.json`` ->
    ``runs/<run>/ckpt/step_k.done`` (``calibrl.checkpoints.write_marker``)."""
    head, _, name = str(eval_path).rpartition("/eval/")
    if not head or not name.endswith(".json"):
        raise ValueError(f"{eval_path}: not an evaluation file runs/<run>/eval/step_<k>.json")
    return f"{head}/ckpt/{name.removesuffix('.json')}.done"
