"""Calibration of the plan's test (calibrl.stats.paired) on the embedded default's own recorded results: its
false-positive rate is near the nominal 5% (in [0.02, 0.08], so a test that wastes power fails as surely as one
that is too liberal), and its power against a 3-point PASS@8 effect at the plan's 16 seeds is at least 0.8.

The recording (tests/data/recorded_default.csv.gz: per seed and per problem, the correct samples out of n = 32
and the distinct correct answers of the plan's primary arms at the final checkpoint, and of the base model at
step 0, from a full run of the default; regenerate with ``python -m calibrl.report.power RESULTS --record
tests/data/recorded_default.csv.gz``) gives each recorded seed's paired difference D_s of each primary claim,
computed through the claims' own code (per-problem metric, split weights, per-seed mean). A simulated experiment
draws 16 seeds with replacement and, under the null, flips which arm is which at random per seed (under no
effect the two arms of a seed are exchangeable): the same draws and flips (common random numbers) serve the
null and the alternative, which adds the effect to every seed's difference."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrl import analysis_plan as AP
from calibrl import stats as S
from calibrl.report import power as PW

REPO = Path(__file__).resolve().parents[1]
RECORDED = Path(__file__).parent / "data" / "recorded_default.csv.gz"
SIMS = 4000


@pytest.fixture(scope="module")
def recorded() -> tuple[dict[str, np.ndarray], AP.Plan]:
    """Each primary claim's recorded per-seed differences (in its unit), and the plan."""
    if not RECORDED.is_file():
        pytest.fail(f"{RECORDED} is missing: regenerate it (see this module's docstring)")
    pp = pd.read_csv(RECORDED)
    plan = AP.load(REPO / "config" / "plan.yaml")
    return {c.id: PW.differences(pp, plan, c, "qwen3-tiny-m") for c in plan.primaries}, plan


def simulate(d: np.ndarray, seeds: int, effect: float, rng: np.random.Generator) -> tuple[float, float]:
    """(false-positive rate, power) of the paired t test at 0.05 over ``SIMS`` experiments of ``seeds`` seeds."""
    idx = rng.integers(0, len(d), (SIMS, seeds))
    signs = rng.choice((-1.0, 1.0), (SIMS, seeds))
    null = d[idx] * signs
    null_p = np.array([S.paired(x).p for x in null])
    alt_p = np.array([S.paired(x).p for x in null + effect])
    return float(np.mean(null_p < S.LEVEL)), float(np.mean(alt_p < S.LEVEL))


def test_the_recording_is_the_plans_design(recorded):
    diffs, plan = recorded
    assert {len(d) for d in diffs.values()} == {len(plan.seeds)}


@pytest.mark.parametrize("claim", ["P1", "P2"])
def test_false_positive_rate_is_nominal_and_a_3_point_effect_is_found(recorded, claim):
    diffs, plan = recorded
    rate, power = simulate(diffs[claim], len(plan.seeds), 3.0, np.random.default_rng(int(claim[1:])))
    sd = float(np.std(diffs[claim], ddof=1))
    print(f"{claim}: per-seed sd {sd:.2f} points; false-positive rate {rate:.3f}, power at 3 points {power:.3f}")
    assert 0.02 <= rate <= 0.08
    assert power >= 0.8
