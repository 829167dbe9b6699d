"""Variance components of a paired method difference, and the paired seeds a target effect needs.

From per-seed, per-problem results of two arms on common seeds (``calibrl.report.load.load_per_problem``), for
the claims' quantity (``calibrl.report.claims.problem_quantity``):
- ``seed_var``: the variance across seeds of the paired difference D_s (what the seeds average down); it holds
  the training-seed part and the evaluation-sampling part;
- ``eval_var``: the evaluation-sampling part of it (plug-in binomial variance of each problem's estimate from
  its n samples, both arms): what more samples per problem or more problems would remove;
- ``problem_var``: the variance of the mean difference over a new draw of problems (bootstrap over problems
  of the seed-mean difference): what more problems remove, and seeds do not;
- ``seeds_needed``: the smallest number of paired seeds S at which ``effect`` is at least ``z`` standard errors,
  sqrt(seed_var / S + problem_var), with z scaled to Student's t on S - 1 degrees of freedom as the claims use.

Usage: ``python -m calibrl.report.power RESULTS MODEL ARM_A ARM_B [--metric pass_at_8] [--effect 3]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from calibrl.report.claims import problem_quantity, sample_of
from calibrl.report.load import load_per_problem


def _eval_var(pp: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (model, method, seed, split, problem): plug-in variance of the problem's estimate of ``metric``."""
    a = pp["correct"] / pp["n"]
    if metric.startswith("pass_at_"):
        k = int(metric.rsplit("_", 1)[1])
        if (pp["n"] != k).any():  # the unbiased estimator's variance is not the Bernoulli one then
            raise ValueError("eval variance of pass@k is computed for n == k only")
        p = 1 - (1 - a) ** k
        v = p * (1 - p)
    else:
        v = a * (1 - a) / pp["n"]
    return pp.assign(q=v)


def components(pp: pd.DataFrame, model: str, a: str, b: str, metric: str, last: int, reps: int = 2000) -> dict:
    """Variance components (in squared percentage points) of ``a`` - ``b`` on their common seeds."""
    q = problem_quantity(pp, metric, last)
    sample = sample_of(q, model, (a, b))
    if sample is None or sample.n_seeds < 2:
        raise ValueError(f"{a} and {b} of {model} need at least two common seeds")
    w = sample.weights
    d = sample.values[a] - sample.values[b]  # (seeds, problems)
    per_seed = d @ w
    last_steps = sorted(pp["step"].unique())[-last:]
    ev = _eval_var(pp[pp["step"].isin(last_steps)], metric)
    ev = ev.groupby(["model", "method", "seed", "split", "problem"], as_index=False)["q"].mean()
    ev_sample = sample_of(ev, model, (a, b))
    # a mean of `last` checkpoints' estimates: independent samples per checkpoint divide the variance by `last`
    eval_var = float(((ev_sample.values[a] + ev_sample.values[b]) @ (w**2)).mean() / len(last_steps))
    rng = np.random.default_rng(0)
    draws = []
    mean_d = d.mean(axis=0)
    for s in np.unique(sample.strata):  # bootstrap problems within each split, seeds fixed
        where = np.flatnonzero(sample.strata == s)
        idx = rng.integers(0, len(where), (reps, len(where)))
        draws.append((mean_d[where][idx] * w[where][None, :] * len(where)).sum(axis=1) / len(where))
    problem_var = float(np.sum(draws, axis=0).var(ddof=1))
    scale = 100.0**2
    return {
        "model": model,
        "arms": [a, b],
        "metric": metric,
        "seeds": sample.n_seeds,
        "problems": int(d.shape[1]),
        "difference": float(per_seed.mean() * 100),
        "per_seed_difference": (per_seed * 100).round(3).tolist(),
        "seed_var": float(per_seed.var(ddof=1) * scale),
        "eval_var": eval_var * scale,
        "problem_var": problem_var * scale,
    }


def seeds_needed(seed_var: float, problem_var: float, effect: float, z: float = 2.0, max_seeds: int = 1000) -> int:
    """Smallest S with effect >= z' * sqrt(seed_var / S + problem_var), z' = z scaled to Student's t (S - 1)."""
    for s in range(2, max_seeds + 1):
        zt = z * st.t.ppf(0.975, s - 1) / st.norm.ppf(0.975)
        if effect >= zt * np.sqrt(seed_var / s + problem_var):
            return s
    return max_seeds + 1


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("model")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--metric", default="pass_at_8")
    ap.add_argument("--effect", type=float, default=3.0, help="percentage points")
    ap.add_argument("--last", type=int, default=2, help="the claims' last checkpoints")
    args = ap.parse_args(argv)
    root = Path(args.results)
    paths = sorted(root.glob(f"runs/{args.model}/*/s*/eval/step_*.json"))
    pp = load_per_problem(paths, root)
    out = components(pp, args.model, args.a, args.b, args.metric, args.last)
    train_var = max(out["seed_var"] - out["eval_var"], 0.0)
    out["training_var"] = train_var
    out["seeds_needed"] = seeds_needed(out["seed_var"], out["problem_var"], args.effect)
    # with evaluation noise removed entirely (unbounded samples per problem), seeds still needed:
    out["seeds_needed_no_eval_noise"] = seeds_needed(train_var, out["problem_var"], args.effect)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
