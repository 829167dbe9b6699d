"""The power of an analysis plan's primary claims, and the variance components behind it, from per-seed,
per-problem results.

For each primary claim (``calibrl.analysis_plan``), from a results folder: the paired differences D_s of its
quantity per training seed (each seed's arms share data order and evaluation samples), their means per data seed
(the unit of replication: the test's input), the standard deviation of those means, and the power of the plan's
t test for an effect equal to the claim's margin at the plan's data seeds, at the Bonferroni level alpha / m
(Holm's first step: a lower bound on Holm's power for that claim), with the fewest data seeds that reach the plan's
target power. The variance components of D_s (a one-way nested ANOVA: between data seeds, and between training
seeds within one) say where the noise is, and so how to split a budget between data and training seeds; beside
them, the part of one seed's difference that comes from which problems were drawn (``var_problems``, the problems
taken as a sample: it is part of the between-data-seed variance, since problems are drawn per data seed).
``--record FILE`` also writes the plan arms' per-seed, per-problem results on every split (the calibration test's
input, ``tests/test_calibration.py``).

Usage: ``python -m calibrl.report.power RESULTS [--plan config/plan.yaml] [--model M] [--record FILE]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from calibrl import analysis_plan as AP
from calibrl import stats as S
from calibrl.report.claims import primary_sample
from calibrl.report.load import load_model_results

RECORD_DIGITS = 9  # significant digits of a recorded log-probability (round_sig)


def differences(pp: pd.DataFrame, plan: AP.Plan, claim: AP.Primary, model: str) -> pd.DataFrame:
    """D_s of ``claim`` (in its unit) per training seed of the plan present in ``pp``, with its data seed and the
    variance of D_s due to the sample of problems (``var_problems``)."""
    sample = primary_sample(claim, pp, model, plan.seeds)
    if sample is None:
        raise ValueError(f"{claim.id}: arms {claim.arms} of {model} have no common seeds of the plan")
    per_problem = (sample.values[claim.arms[0]] - sample.values[claim.arms[1]]) * claim.scale  # (seeds, problems)
    d = per_problem @ sample.weights
    # the variance the drawn problems add to one seed's difference: sum_i w_i^2 (x_i - mean)^2, the problems taken
    # as a sample (they are drawn once per data seed, so this part is inside the between-data-seed variance)
    problems = ((per_problem - d[:, None]) ** 2 * sample.weights**2).sum(-1)
    seeds = sample.seeds
    return pd.DataFrame({"seed": seeds, "data": [plan.data_of[s] for s in seeds], "d": d, "var_problems": problems})


def components(d: pd.DataFrame) -> tuple[float, float]:
    """(variance between data seeds, variance between training seeds within one) of D_s, by the one-way nested
    ANOVA's method of moments (balanced; the between part floored at 0)."""
    groups = d.groupby("data")["d"]
    n = float(groups.size().mean())
    within = float(groups.var(ddof=1).mean()) if n > 1 else float("nan")
    between = float(groups.mean().var(ddof=1)) - (within / n if n > 1 else 0.0)
    return max(between, 0.0), within


def report(pp: pd.DataFrame, plan: AP.Plan, model: str) -> list[dict]:
    level = plan.level / len(plan.primaries)
    out = []
    for c in plan.primaries:
        d = differences(pp, plan, c, model)
        units = d.groupby("data")["d"].mean()
        sd = float(units.std(ddof=1))
        between, within = components(d)
        out.append(
            {
                "claim": f"{c.id}: {c.claim}",
                "data_seeds": len(units),
                "training_seeds": len(d),
                "mean": float(d["d"].mean()),
                "sd_of_data_seed_means": sd,
                "var_data_seed": between,
                "var_training_seed": within,
                "var_problems": float(d["var_problems"].mean()),
                "margin": c.margin,
                "unit": c.unit,
                "level": level,
                "power_at_plan_data_seeds": S.power(sd, c.margin, len(plan.data_seeds), level),
                "data_seeds_needed": S.seeds_needed(sd, c.margin, plan.power, level),
            }
        )
    return out


def record(pp: pd.DataFrame, plan: AP.Plan, model: str, path: str | Path) -> None:
    """The plan arms' per-problem results on the plan's seeds, at the checkpoints the plan reads (base: step 0), on
    every split they were evaluated on (those no claim weighs too: no split's result exists only on one disk), gzipped
    CSV (the modes only of the arms a Definition 2.1 claim compares, each log-probability to ``RECORD_DIGITS``
    significant digits: the file stays small enough for git)."""
    last = max(c.checkpoints for c in plan.claims())
    mine = pp[(pp["model"] == model) & pp["seed"].isin(plan.seeds)]
    runs = mine[mine["method"].isin(plan.arms())]
    steps = sorted(runs["step"].unique())[-last:]
    keep = pd.concat([runs[runs["step"].isin(steps)], mine[mine["method"] == AP.BASE]])
    if "modes" in keep:  # each problem's {mode: log-probability}, as JSON, for the arms a Definition 2.1 primary reads
        # the base model too: every reading of Definition 2.1 is against it
        measured = {a for c in plan.claims() if c.metric in AP.DEFINITION_2_1 for a in (*c.arms, AP.BASE)}
        text = [
            json.dumps({k: round_sig(v) for k, v in m.items()}, sort_keys=True)
            if isinstance(m, dict) and arm in measured
            else None
            for m, arm in zip(keep["modes"], keep["method"])
        ]
        keep = keep.assign(modes=text)
    keep.to_csv(path, index=False, compression="gzip")


def record_provenance(root: str | Path, plan: AP.Plan, model: str, path: str | Path) -> dict:
    """Beside a recording (``<path>.machine.json``): each data seed's warm start, its weights' SHA-256 and the machine
    that made it (the warm start's info file, ``calibrl.provenance``), and the machines of them all: a rerun on the
    same ISA and torch build reproduces the recording bit for bit, another only statistically
    (``calibrl.report.reproduce``)."""
    starts = {}
    for data in plan.data_seeds:
        info = Path(root) / "models" / model / f"d{data}" / "init.json"
        if info.is_file():
            got = json.loads(info.read_text())
            starts[str(data)] = {"weights_sha256": got.get("weights_sha256"), "machine": got.get("machine")}
    machines = [m for m in {json.dumps(s["machine"], sort_keys=True): s["machine"] for s in starts.values()}.values()]
    out = {
        "plan_sha256": plan.sha256,
        "machine": machines[0] if len(machines) == 1 else machines,
        "warm_starts": starts,
    }
    Path(f"{path}.machine.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


def round_sig(value: float) -> float:
    """``value`` to ``RECORD_DIGITS`` significant digits: a recorded log-probability (a float64 sum over a float32
    model's tokens) moves by under 1e-8 of itself, and 24 data seeds' file stays under the 2 MiB a tracked file may
    take."""
    return float(f"{value:.{RECORD_DIGITS}g}")


def read_record(path: str | Path) -> pd.DataFrame:
    """A file :func:`record` wrote, its modes parsed back."""
    pp = pd.read_csv(path, low_memory=False)  # whole: the modes column is text on some rows, empty on others
    if "modes" in pp:
        pp["modes"] = [json.loads(m) if isinstance(m, str) else np.nan for m in pp["modes"]]
    return pp


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--plan", default="config/plan.yaml")
    ap.add_argument("--model", default="qwen3-tiny-m")
    ap.add_argument("--record", help="write the primary arms' per-problem results here (.csv.gz)")
    args = ap.parse_args(argv)
    root = Path(args.results)
    plan = AP.load(args.plan)
    pp = load_model_results(root, args.model)
    out = report(pp, plan, args.model)
    print(json.dumps(out, indent=1))
    if args.record:
        record(pp, plan, args.model, args.record)
        record_provenance(root, plan, args.model, args.record)
    return out


if __name__ == "__main__":
    main()
