"""Loading the grid's result files: evaluation summaries, per-problem results, training metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from calibrl.runs import Run


def metrics(grid: dict) -> dict[str, str]:
    """Metric keys of the evaluation files and their table labels, e.g. avg_at_8 -> AVG@8."""
    k = grid["eval"]["k"]
    return {f"avg_at_{k}": f"AVG@{k}", f"pass_at_{k}": f"PASS@{k}"}


def _run(path: Path, root: str | Path) -> tuple[str, str, int]:
    """(model, method, seed) of a result file, from its place under ``{root}/runs/`` (calibrl.grid.Run)."""
    run = Run.from_path(path.resolve().relative_to(Path(root).resolve()).as_posix())
    return run.model, run.method, run.seed


def load_evals(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    """Long frame (model, method, seed, step, split, metric, value) from ``runs/{model}/{method}/s{seed}/eval``."""
    rows = []
    for path in paths:
        path = Path(path)
        model, method, seed = _run(path, root)
        data = json.loads(path.read_text())
        for split, metrics in data["splits"].items():
            for metric, value in metrics.items():
                if metric != "per_problem":
                    rows.append((model, method, seed, int(data["step"]), split, metric, float(value)))
    return pd.DataFrame(rows, columns=["model", "method", "seed", "step", "split", "metric", "value"])


def load_per_problem(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    """One row per (model, method, seed, step, split, problem): correct samples out of n, distinct correct answers,
    and where measured (``calibrl.modes``) each correct mode's log-probability (``modes``: a dict; else None).

    Problems are numbered in the split's order, which is the same for every run, so arms and seeds pair on them.
    Evaluation files written before per-problem results were recorded give no rows."""
    frames = []
    for path in paths:
        model, method, seed = _run(Path(path), root)
        data = json.loads(Path(path).read_text())
        for split, m in data["splits"].items():
            per = m.get("per_problem")
            if per is None:
                continue
            modes = per.get("modes", [None] * len(per["correct"]))  # absent: a task whose modes are not listed
            frames.append(
                pd.DataFrame({"correct": per["correct"], "distinct": per["distinct"], "modes": modes}).assign(
                    model=model,
                    method=method,
                    seed=seed,
                    step=int(data["step"]),
                    split=split,
                    n=int(m["n_samples"]),
                    problem=range(len(per["correct"])),
                )
            )
    cols = ["model", "method", "seed", "step", "split", "problem", "n", "correct", "distinct", "modes"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def load_model_results(root: str | Path, model: str) -> pd.DataFrame:
    """:func:`load_per_problem` of every evaluation of ``model`` in a results folder (its runs and base model)."""
    root = Path(root)
    return load_per_problem(sorted(root.glob(f"runs/{model}/*/s*/eval/step_*.json")), root)


def load_train_metrics(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    frames = []
    for path in paths:
        path = Path(path)
        model, method, seed = _run(path, root)
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        frames.append(pd.DataFrame(lines).assign(model=model, method=method, seed=seed))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def plans(paths: list[str | Path]) -> dict[str, str | None]:
    """Per evaluation file, the hash of the analysis plan it was made under (None: no plan)."""
    return {str(p): json.loads(Path(p).read_text()).get("plan") for p in paths}
