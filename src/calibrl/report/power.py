"""The power of an analysis plan's primary claims, from per-seed, per-problem results.

For each primary claim (``calibrl.analysis_plan``), from a results folder: the per-seed paired differences D_s of
its quantity (the unit of replication; each seed's arms share data order and evaluation samples, so D_s holds
training and evaluation noise once each), their standard deviation, and the power of the plan's paired t test
for an effect equal to the claim's margin at the plan's seeds, at the Bonferroni level alpha / m (Holm's first
step: a lower bound on Holm's power for that claim), with the fewest seeds that reach the plan's target power.
``--record FILE`` also writes the primary arms' per-seed, per-problem results (the calibration test's input,
``tests/test_calibration.py``).

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
from calibrl.report.claims import problem_quantity, sample_of
from calibrl.report.load import load_per_problem


def differences(pp: pd.DataFrame, plan: AP.Plan, claim: AP.Primary, model: str) -> np.ndarray:
    """D_s of ``claim`` on the plan's seeds present in ``pp`` (in the claim's unit)."""
    sample = sample_of(problem_quantity(pp, claim.metric, claim.checkpoints), model, claim.arms, plan.seeds)
    if sample is None:
        raise ValueError(f"{claim.id}: arms {claim.arms} of {model} have no common seeds of the plan")
    return (sample.per_seed(claim.arms[0]) - sample.per_seed(claim.arms[1])) * claim.scale


def report(pp: pd.DataFrame, plan: AP.Plan, model: str) -> list[dict]:
    level = plan.level / len(plan.primaries)
    out = []
    for c in plan.primaries:
        d = differences(pp, plan, c, model)
        sd = float(d.std(ddof=1))
        out.append(
            {
                "claim": f"{c.id}: {c.claim}",
                "seeds": len(d),
                "mean": float(d.mean()),
                "sd": sd,
                "margin": c.margin,
                "unit": c.unit,
                "level": level,
                "power_at_plan_seeds": S.power(sd, c.margin, len(plan.seeds), level),
                "seeds_needed": S.seeds_needed(sd, c.margin, plan.power, level),
            }
        )
    return out


def record(pp: pd.DataFrame, plan: AP.Plan, model: str, path: str | Path) -> None:
    """The primary arms' per-problem results at the checkpoints the plan reads (base: step 0), gzipped CSV."""
    last = max(c.checkpoints for c in plan.primaries)
    runs = pp[(pp["model"] == model) & pp["method"].isin(plan.arms())]
    steps = sorted(runs["step"].unique())[-last:]
    keep = pd.concat([runs[runs["step"].isin(steps)], pp[(pp["model"] == model) & (pp["method"] == AP.BASE)]])
    keep.to_csv(path, index=False, compression="gzip")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--plan", default="config/plan.yaml")
    ap.add_argument("--model", default="qwen3-tiny-m")
    ap.add_argument("--record", help="write the primary arms' per-problem results here (.csv.gz)")
    args = ap.parse_args(argv)
    root = Path(args.results)
    plan = AP.load(args.plan)
    pp = load_per_problem(sorted(root.glob(f"runs/{args.model}/*/s*/eval/step_*.json")), root)
    out = report(pp, plan, args.model)
    print(json.dumps(out, indent=1))
    if args.record:
        record(pp, plan, args.model, args.record)
    return out


if __name__ == "__main__":
    main()
