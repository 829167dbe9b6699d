"""The same grid cells trained by two trainers, side by side: what changes with the trainer alone.

Two results folders (one per ``grid.trainer``; a run's folder does not name its trainer, so each trainer writes its
own) are matched run by run. A run is compared only where it is the same cell: its ``settings.json`` equal in
everything but ``backend`` (method, model, data, seed, training settings, plan) and in its inputs' digests, and its
checkpoints evaluated with the same sampling; anything else is refused by the key that differs.

For each evaluated step and split: AVG@k and PASS@k under both trainers, their difference and a 95% interval of it
paired over the split's problems (Student's t, df = problems - 1; per problem, the fraction correct and the unbiased
pass@k, ``calibrl.metrics``). One seed a trainer: the interval is the evaluation's sampling noise over these
problems, not the trainer's effect over seeds, so it says whether two checkpoints differ, not that the trainers do.
Training metrics both trainers log under one name follow, step by step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrl import stats
from calibrl.checkpoints import RunStamp, changed_keys
from calibrl.metrics import pass_at_k
from calibrl.runs import Run

__all__ = ["compare", "render", "same_cell"]

LEVEL = 1 - stats.LEVEL  # the intervals' coverage (calibrl.stats: 0.05)


def same_cell(a: RunStamp, b: RunStamp) -> list[str]:
    """The keys in which two runs' stamps differ beyond their trainer (``settings.backend``): none for one cell."""
    beyond = [{k: v for k, v in stamp.settings.items() if k != "backend"} for stamp in (a, b)]
    return changed_keys(*beyond, "settings.") + changed_keys(dict(a.inputs), dict(b.inputs), "inputs.")


def _stamps(results: Path) -> dict[Run, RunStamp]:
    found = {Run.from_path(str(p.parent)): RunStamp.read(p) for p in sorted(results.glob("runs/*/*/s*/settings.json"))}
    if not found:
        raise ValueError(f"{results}: no runs (no runs/{{model}}/{{method}}/s{{seed}}/settings.json)")
    trainers = {s.settings["backend"] for s in found.values()}
    if len(trainers) != 1:
        raise ValueError(f"{results}: runs of several trainers {sorted(trainers)}; one folder a trainer")
    return found


def _evals(results: Path, run: Run) -> dict[int, dict]:
    folder = results / "runs" / run.path / "eval"
    return {int(d["step"]): d for d in (json.loads(p.read_text()) for p in sorted(folder.glob("step_*.json")))}


def _per_problem(split: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
    n, correct = int(split["n_samples"]), split["per_problem"]["correct"]
    return np.array([c / n for c in correct]), np.array([pass_at_k(n, c, k) for c in correct])


def compare(first: str | Path, second: str | Path) -> tuple[tuple[str, str], pd.DataFrame, pd.DataFrame]:
    """``((trainer of first, trainer of second), evaluations, training)`` of the runs both folders hold.

    ``evaluations``: one row per (model, method, seed, step, split, metric) with ``a``, ``b``, ``diff`` (b - a),
    ``low``, ``high`` and ``problems``. ``training``: one row per (model, method, seed, step, metric) both logged.
    Raises ValueError for folders of one trainer, no common run, or a common run that is not the same cell."""
    first, second = Path(first), Path(second)
    sa, sb = _stamps(first), _stamps(second)
    ta, tb = (next(iter(s.values())).settings["backend"] for s in (sa, sb))
    if ta == tb:
        raise ValueError(f"{first} and {second}: both trained by {ta}; compare two trainers' folders")
    common = sorted(sa.keys() & sb.keys(), key=lambda r: r.path)
    if not common:
        raise ValueError(f"{first} and {second}: no run in both (same model, method and seed)")
    evals, train = [], []
    for run in common:
        if differ := same_cell(sa[run], sb[run]):
            raise ValueError(f"{run.path}: not the same cell under both trainers; settings.json differs in {differ}")
        ea, eb = _evals(first, run), _evals(second, run)
        for step in sorted(ea.keys() & eb.keys()):
            if ea[step]["sampling"] != eb[step]["sampling"]:
                keys = changed_keys(ea[step]["sampling"], eb[step]["sampling"])
                raise ValueError(f"{run.path}/eval/step_{step}.json: evaluated differently, sampling.{keys}")
            k = int(ea[step]["sampling"]["k"])
            for split in sorted(ea[step]["splits"].keys() & eb[step]["splits"].keys()):
                xa, xb = ea[step]["splits"][split], eb[step]["splits"][split]
                pa, pb = _per_problem(xa, k), _per_problem(xb, k)
                for metric, a, b in ((f"AVG@{k}", pa[0], pb[0]), (f"PASS@{k}", pa[1], pb[1])):
                    e = stats.paired(b - a)  # NaN bounds for a single problem
                    evals.append((run.model, run.method, run.seed, step, split, metric, a.mean(), b.mean(),
                                  e.estimate, e.ci_low, e.ci_high, len(a)))  # fmt: skip
        train += _training(first, second, run)
    cols = ["model", "method", "seed", "step", "split", "metric", "a", "b", "diff", "low", "high", "problems"]
    tcols = ["model", "method", "seed", "step", "metric", "a", "b"]
    return (ta, tb), pd.DataFrame(evals, columns=cols), pd.DataFrame(train, columns=tcols)


def _training(first: Path, second: Path, run: Run) -> list[tuple]:
    def rows(results: Path) -> dict[int, dict]:
        path = results / "runs" / run.path / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        return {int(r["step"]): r for r in (json.loads(x) for x in lines if x.strip())}

    ra, rb = rows(first), rows(second)
    out = []
    for step in sorted(ra.keys() & rb.keys()):
        for name in sorted((ra[step].keys() & rb[step].keys()) - {"step"}):
            out.append((run.model, run.method, run.seed, step, name, ra[step][name], rb[step][name]))
    return out


def render(trainers: tuple[str, str], evals: pd.DataFrame, train: pd.DataFrame) -> str:
    """Markdown: the evaluations' table, then the training metrics both trainers log."""
    a, b = trainers
    lines = [
        f"# The same cells under {a} and {b}",
        "",
        f"Difference {b} - {a}, with its {LEVEL:.0%} interval paired over the split's problems (t, df = problems - 1). "
        "One seed a trainer: the interval is the evaluation's sampling noise at these checkpoints, not the trainer's "
        "effect over seeds; a difference inside it is not a finding.",
        "",
        f"| run | step | split | metric | {a} | {b} | {b} - {a} | {LEVEL:.0%} interval | problems |",
        "|---|---:|---|---|---:|---:|---:|---|---:|",
    ]
    for r in evals.itertuples():
        interval = "n/a" if np.isnan(r.low) else f"[{r.low:+.3f}, {r.high:+.3f}]"
        lines.append(f"| {r.model}/{r.method}/s{r.seed} | {r.step} | {r.split} | {r.metric} | {r.a:.3f} | {r.b:.3f} "
                     f"| {r.diff:+.3f} | {interval} | {r.problems} |")  # fmt: skip
    lines += ["", f"## Training metrics both log under one name ({a} / {b})", ""]
    if train.empty:
        return "\n".join([*lines, "None in common.", ""])
    lines += [f"| run | step | metric | {a} | {b} |", "|---|---:|---|---:|---:|"]
    for r in train.itertuples():
        lines.append(f"| {r.model}/{r.method}/s{r.seed} | {r.step} | {r.metric} | {r.a:.4g} | {r.b:.4g} |")
    return "\n".join([*lines, ""])
