"""Does a rerun reproduce the recording? Its per-seed values of the plan's primary arms against the recorded ones.

The guarantee is bitwise on one machine (the same CPU instruction set and torch build: ``calibrl.provenance``) and
statistical across machines: there the warm starts already differ in float rounding, and so does everything after
them. For each primary claim of the plan and each of its arms, on the seeds both have: each seed's value in the
claim's unit (``calibrl.report.claims.primary_sample``, as the claims compute it, the mean over problems correctly
rounded: :func:`per_seed`), the share of seeds equal bit for bit, the largest difference, and whether the
differences stay within the recorded spread. The spread is the recording's standard deviation of the arm's
per-seed value between training seeds of one data seed (pooled over data seeds): how far two runs on the same
problems and warm start lie apart. An arm agrees when neither test below rejects at a family-wise ``LEVEL`` over
the distinct (arm, quantity) lines (Bonferroni): the mean difference, per data seed (the unit a rerun on another
machine replicates: its warm start differs), by a paired t test; and each seed's difference against what two
independent runs give, sqrt(2) spreads times the normal quantile of the corrected level. The rerun's
log-probabilities are rounded as the recording's were (``calibrl.report.power.round_sig``).

Verdict: "bitwise identical", "agrees statistically" (exit 0) or "DIFFERS" (exit 1); exit 2 when the rerun and the
recording share no seed. Beside it, the machine here and, where the files say, the rerun's warm starts' and the
recording's (its sidecar ``<record>.machine.json``), and each primary claim's reading in the rerun's ``claims.csv``
against the recording's (``recorded_claims.csv`` beside the record): for information, not part of the verdict, since
per-seed values that agree statistically can still move a claim near its boundaries (zero, the margin) across one.

Usage: ``python -m calibrl.report.reproduce RESULTS [--record tests/data/recorded_default.csv.gz]
[--plan config/plan.yaml] [--model qwen3-tiny-m]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from calibrl import analysis_plan as AP
from calibrl import provenance
from calibrl import stats as S
from calibrl.report.claims import primary_sample
from calibrl.report.load import load_model_results
from calibrl.report.power import read_record, round_sig

LEVEL = 0.05  # family-wise, over the distinct (arm, quantity) lines compared
IDENTICAL, AGREES, DIFFERS = "bitwise identical", "agrees statistically", "DIFFERS"
BUILD = ("isa", "cpu_capability", "torch", "mkl", "mkldnn", "platform")  # what decides bitwise equality


def as_recorded(pp: pd.DataFrame) -> pd.DataFrame:
    """``pp`` with each mode's log-probability rounded as :func:`calibrl.report.power.record` writes it, so that a
    rerun meets the recording on equal terms (rounding twice changes nothing)."""
    if "modes" not in pp:
        return pp
    modes = [{k: round_sig(v) for k, v in m.items()} if isinstance(m, dict) else m for m in pp["modes"]]
    return pp.assign(modes=modes)


def per_seed(sample: S.Sample, arm: str) -> np.ndarray:
    """``sample.per_seed(arm)``, each seed's sum correctly rounded (``math.fsum``): equal problems' values give equal
    bits whichever other seeds the sample holds (a matrix product's rounding depends on its number of rows)."""
    return np.array([math.fsum(row * sample.weights) for row in sample.values[arm]])


def spread(values: np.ndarray, seeds: list[int], data_of: dict[int, int]) -> float:
    """The standard deviation of per-seed ``values`` between training seeds of one data seed, pooled over data seeds
    (NaN where no data seed has two training seeds)."""
    frame = pd.DataFrame({"v": values, "data": [data_of.get(s, s) for s in seeds]})
    groups = frame.groupby("data")["v"]
    df = int((groups.size() - 1).sum())
    squares = float(((frame["v"] - groups.transform("mean")) ** 2).sum())
    return float(np.sqrt(squares / df)) if df > 0 else float("nan")


def compare(rerun_pp: pd.DataFrame, recorded_pp: pd.DataFrame, plan: AP.Plan, model: str) -> list[dict]:
    """One row per distinct (arm, quantity) of the plan's primary claims: the seeds both have, how many of their
    per-seed values are equal bit for bit, the differences (rerun minus recording, in the claim's unit) against the
    recorded spread, and the row's verdict ("identical", "agrees", "DIFFERS", or "no common seeds")."""
    rerun_pp = as_recorded(rerun_pp)
    lines = {}  # (arm, metric, splits, factor) -> (claim, arm): a quantity two claims share is compared once
    for c in plan.primaries:
        for arm in c.arms:
            lines.setdefault((arm, c.metric, c.splits, c.factor), (c, arm))
    level = LEVEL / len(lines)
    rows = []
    for c, arm in lines.values():
        rec = primary_sample(c, recorded_pp, model, plan.seeds)
        new = primary_sample(c, rerun_pp, model, plan.seeds)
        common = sorted(set(rec.seeds) & set(new.seeds)) if rec is not None and new is not None else []
        row = {"claim": c.id, "arm": arm, "unit": c.unit, "seeds": len(common)}
        if not common:
            rows.append(row | {"verdict": "no common seeds"})
            continue
        recorded = per_seed(rec, arm) * c.scale
        before = recorded[[rec.seeds.index(s) for s in common]]
        after = (per_seed(new, arm) * c.scale)[[new.seeds.index(s) for s in common]]
        d = after - before
        sd = spread(recorded, rec.seeds, plan.data_of)
        units = np.array([plan.data_of.get(s, s) for s in common])
        e = S.paired(np.array([d[units == u].mean() for u in dict.fromkeys(units.tolist())]))
        worst = float(np.abs(d).max())
        limit = float(np.sqrt(2) * st.norm.isf(level / (2 * len(common))))  # in spreads: two runs' difference
        identical = bool(np.all(after == before))
        centred = e.estimate == 0 or not e.p < level  # one data seed (NaN p): not tested
        within = worst == 0 or worst <= limit * sd  # NaN spread: only if no difference
        rows.append(
            row
            | {
                "bitwise": float(np.mean(after == before)),
                "max_abs_diff": worst,
                "mean_diff": e.estimate,
                "se": e.se,
                "p": e.p,
                "spread": sd,
                "limit_in_spreads": limit,
                "max_in_spreads": worst / sd if sd > 0 else (0.0 if worst == 0 else float("inf")),
                "verdict": "identical" if identical else ("agrees" if centred and within else "DIFFERS"),
            }
        )
    return rows


def verdict(rows: list[dict]) -> tuple[str, int]:
    """The rows' verdict and exit status: bitwise identical or agrees statistically (0), DIFFERS (1), or no common
    seeds anywhere (2). Claims without common seeds do not count where others have some."""
    compared = [r["verdict"] for r in rows if r["seeds"]]
    if not compared:
        return "no common seeds: nothing to compare", 2
    if all(v == "identical" for v in compared):
        return IDENTICAL, 0
    if all(v in ("identical", "agrees") for v in compared):
        return AGREES, 0
    return DIFFERS, 1


def line(r: dict) -> str:
    """One (claim, arm) row, printed."""
    head = f"{r['claim']} {r['arm']}: {r['seeds']} seeds"
    if not r["seeds"]:
        return f"{head}, not compared (no common seeds)"
    return (
        f"{head}, {r['bitwise']:.0%} bitwise; diff mean {r['mean_diff']:+.3g} +- {r['se']:.2g} {r['unit']} over "
        f"data seeds (p {r['p']:.3g}), max |diff| {r['max_abs_diff']:.3g} = {r['max_in_spreads']:.2f} spreads of "
        f"{r['spread']:.3g} (limit {r['limit_in_spreads']:.2f}): {r['verdict']}"
    )


def machines(results: Path, model: str, record: Path) -> list[str]:
    """Lines naming the machine here, the rerun's warm starts' (their info files, where they record one) and the
    recording's (its sidecar, where there is one), and the build fields in which they differ."""
    here = provenance.machine()
    seen = {"here": here}
    starts = []
    for info in sorted(results.glob(f"models/{model}/d*/init.json")):
        m = json.loads(info.read_text()).get("machine")
        if m and m not in starts:
            starts.append(m)
    for i, m in enumerate(starts):
        seen[f"rerun's warm starts{f' ({i + 1})' if len(starts) > 1 else ''}"] = m
    sidecar = Path(f"{record}.machine.json")
    if sidecar.is_file():
        data = json.loads(sidecar.read_text())
        seen["recording"] = data.get("machine", data)
    out = [f"machine, {name}: {json.dumps(m, sort_keys=True)}" for name, m in seen.items()]
    if "recording" not in seen:
        out.append(f"machine, recording: not recorded (no {sidecar})")
        return out
    ours = [m for name, m in seen.items() if name != "recording"]
    recorded = seen["recording"] if isinstance(seen["recording"], list) else [seen["recording"]]  # several machines
    differ = sorted({k for m in ours for r in recorded for k in BUILD if m.get(k) != r.get(k)})
    out.append(
        f"build differs from the recording's in {', '.join(differ)}: expect statistical agreement, not bitwise"
        if differ
        else "same ISA and torch build as the recording: expect bitwise identical"
    )
    return out


def _reading(row: pd.Series) -> str:
    return f"{row['reading']} ({row['estimate']:.3g} [{row['ci_low']:.3g}, {row['ci_high']:.3g}])"


def readings(rerun: Path, recorded: Path) -> list[str]:
    """A line per primary claim of the recording: its reading and 95% interval there and in the rerun's claims, and
    whether the reading is the same (information: not part of the verdict)."""
    missing = [p for p in (rerun, recorded) if not p.is_file()]
    if missing:
        return [f"claims: not compared (no {missing[0]})"]
    new, old = (pd.read_csv(p).set_index("claim") for p in (rerun, recorded))
    out = []
    for claim, r in old[old["role"] == "primary"].iterrows():
        if claim not in new.index:
            out.append(f"claim {claim}: not in the rerun's claims")
            continue
        n = new.loc[claim]
        same = "same reading" if n["reading"] == r["reading"] else "reading differs"
        out.append(f"claim {claim.split(':')[0]}: recording {_reading(r)}, rerun {_reading(n)}: {same}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--record", default="tests/data/recorded_default.csv.gz")
    ap.add_argument("--plan", default="config/plan.yaml")
    ap.add_argument("--model", default="qwen3-tiny-m")
    args = ap.parse_args(argv)
    root, record = Path(args.results), Path(args.record)
    if not record.is_file():
        ap.error(f"--record {record}: no such file (the recording is {ap.get_default('record')} in the repository: "
                 "run from its root or pass its path)")  # fmt: skip
    plan = AP.load(args.plan)
    rerun = load_model_results(root, args.model)
    rows = compare(rerun, read_record(record), plan, args.model)
    for text in machines(root, args.model, record):
        print(text)
    for r in rows:
        print(line(r))
    for text in readings(root / "claims.csv", record.parent / "recorded_claims.csv"):
        print(text)
    text, code = verdict(rows)
    print(f"verdict: {text}")
    return code


if __name__ == "__main__":
    sys.exit(main())
