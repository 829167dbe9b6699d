"""The claims' statistics (calibrl.report.stats, calibrl.report.claims): Holm, verdicts, the paired hierarchical
bootstrap, and the calibration test: two arms that are one method under two names must be called different
(holds or contradicted) at no more than the nominal rate.

The calibration simulates experiments from recorded results (tests/data/recorded_per_problem.csv.gz: per seed and
per problem, the correct samples out of n = 8 of GRPO, 4 seeds, on the embedded grid's main model at step 100;
regenerate with ``make_recorded`` below from a finished run): each simulated seed of each arm is a recorded seed
drawn at random, its problems drawn with replacement from the recorded problems (the same draw for both arms and
every seed: common problems), and fresh evaluation samples drawn binomially around the recorded rates, scored as
AVG@8 or as the unbiased PASS@8; the claims are a difference of two arms, or a "best of" claim over three."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrl import stats as S
from calibrl.metrics import pass_at_k
from calibrl.report import claims as C

RECORDED = Path(__file__).parent / "data" / "recorded_per_problem.csv.gz"


def test_holm_matches_hand_computed_values():
    # p sorted 0.01, 0.02, 0.03, 0.04 -> 4*0.01, 3*0.02, 2*0.03, 1*0.04, made monotone
    assert S.holm([0.04, 0.01, 0.03, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    out = S.holm([0.5, float("nan"), 0.001])
    assert out[0] == pytest.approx(0.5) and np.isnan(out[1]) and out[2] == pytest.approx(0.002)


def test_verdicts_are_three_way():
    assert S.verdict(2.0, 0.01) == "holds"
    assert S.verdict(-2.0, 0.01) == "contradicted"
    assert S.verdict(2.0, 0.2) == "inconclusive"
    assert S.verdict(2.0, float("nan")) == "inconclusive"
    assert S.verdict(0.005, 0.0001, min_effect=0.01) == "inconclusive"


def _sample(a: np.ndarray, b: np.ndarray, splits: np.ndarray) -> S.Sample:
    counts = pd.Series(splits).map(pd.Series(splits).value_counts()).to_numpy()
    weights = 1.0 / (counts * len(set(splits)))
    return S.Sample({"a": a, "b": b}, weights, pd.factorize(splits)[0], list(range(len(a))))


def test_one_seed_is_never_decided_and_the_interval_covers_the_truth():
    rng = np.random.default_rng(0)
    splits = np.array(["test"] * 50 + ["ood"] * 30)
    one = S.bootstrap(_sample(rng.random((1, 80)), rng.random((1, 80)), splits), lambda m: m["a"] - m["b"])
    assert one.seeds == 1 and np.isnan(one.p)
    # a constant shift of 0.1 on every problem and seed, with seed noise: the estimate is 0.1 within its interval
    base = rng.random((5, 80)) + rng.normal(0, 0.05, (5, 1))
    e = S.bootstrap(_sample(base + 0.1, base, splits), lambda m: m["a"] - m["b"], reps=500)
    assert e.estimate == pytest.approx(0.1) and e.ci_low <= 0.1 <= e.ci_high and e.p < 0.01


def recorded() -> pd.DataFrame:
    if not RECORDED.is_file():
        pytest.skip(f"{RECORDED} missing")
    return pd.read_csv(RECORDED)


def simulate(
    rec: pd.DataFrame, seeds: int, rng: np.random.Generator, shift: float = 0.0, metric: str = "avg", arms=("a", "b")
) -> S.Sample:
    """One experiment with arms of the recorded method (``shift`` added to arm a's success rate), each problem
    scored as AVG@n (``metric`` "avg") or the unbiased PASS@n from the same fresh samples ("pass")."""
    wide = rec.pivot_table(index="seed", columns=["split", "problem"], values="correct")
    n = int(rec["n"].iloc[0])
    rates = (wide.to_numpy() + 0.5) / (n + 1)  # recorded seeds x problems, kept off 0 and 1
    splits = wide.columns.get_level_values("split").to_numpy()
    cols = np.concatenate([rng.choice(np.flatnonzero(splits == s), (splits == s).sum()) for s in np.unique(splits)])
    values = {}
    for arm in arms:
        delta = shift if arm == "a" else 0.0
        p = np.clip(rates[rng.integers(0, len(rates), seeds)][:, cols] + delta, 0, 1)
        correct = rng.binomial(n, p)  # fresh evaluation samples
        values[arm] = correct / n if metric == "avg" else np.vectorize(lambda c: pass_at_k(n, int(c), n))(correct)
    counts = pd.Series(splits[cols]).map(pd.Series(splits[cols]).value_counts()).to_numpy()
    weights = 1.0 / (counts * len(set(splits)))
    return S.Sample(values, weights, pd.factorize(splits[cols])[0], list(range(seeds)))


@pytest.mark.parametrize(
    ("seeds", "metric", "kind"),
    [(2, "avg", "diff"), (3, "avg", "diff"), (5, "avg", "diff"), (2, "pass", "diff"), (3, "pass", "diff"),
     (5, "pass", "diff"), (3, "avg", "best"), (3, "pass", "best")],
)  # fmt: skip
def test_calibration_same_method_under_two_names(seeds, metric, kind):
    """False-positive rate of a single claim (no Holm) at the nominal 5%, on 400 null experiments: a difference
    of two arms, or a "best of" claim (arm a above the best of two others; all three the same method)."""
    rec = recorded()
    rng = np.random.default_rng(seeds + 10 * (metric == "pass") + 100 * (kind == "best"))
    claim = C.Claim("null", "test", "m", metric, kind, ("a", "b") if kind == "diff" else ("a", "b", "c"))
    sims = 400
    decided = 0
    for i in range(sims):
        sample = simulate(rec, seeds, rng, metric=metric, arms=claim.arms)
        e = S.bootstrap(sample, claim.contrast, reps=300, seed=i, linear=kind == "diff")
        decided += S.verdict(e.estimate, e.p) != "inconclusive"
    rate = decided / sims
    print(f"calibration: {kind} {metric}, {seeds} seeds per arm, false-positive rate {rate:.3f} over {sims} runs")
    # nominal 0.05; allow Monte Carlo noise (sd of a rate over 400 runs at 0.05: 0.011)
    assert rate <= S.LEVEL + 0.03


def test_a_real_difference_is_found():
    """The same machinery, arm a better by 15 points on every problem: holds in most experiments (it can fail)."""
    rec = recorded()
    rng = np.random.default_rng(1)
    found = []
    for i in range(40):
        e = S.bootstrap(simulate(rec, 5, rng, shift=0.15), lambda m: m["a"] - m["b"], reps=300, seed=i)
        found.append(S.verdict(e.estimate, e.p) == "holds")
    assert np.mean(found) >= 0.8


def per_problem_files(res: Path, effects: dict[str, float], seeds: int, n: int = 8) -> list[str]:
    """Evaluation files with per-problem results: method m solves problems at rate 0.4 + effects[m] + seed noise."""
    rng = np.random.default_rng(0)
    paths = []
    for method, effect in effects.items():
        for seed in range(seeds):
            u = np.random.default_rng(100 + seed).normal(0, 0.02)  # shared by arms: common random numbers
            for step in (50, 100):
                splits = {}
                for split, size in (("test", 60), ("ood", 40)):
                    correct = rng.binomial(n, np.clip(0.4 + effect + u, 0, 1), size).tolist()
                    splits[split] = {
                        "avg_at_8": float(np.mean(correct)) / n,
                        "pass_at_8": 0.0,
                        "n_samples": n,
                        "per_problem": {"correct": correct, "distinct": [min(c, 2) for c in correct]},
                    }
                path = res / "runs" / "m" / method / f"s{seed}" / "eval" / f"step_{step}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"step": step, "splits": splits}))
                paths.append(str(path))
    return paths


def test_claims_from_files_hold_for_a_real_effect_and_not_for_none(tmp_path):
    from calibrl.report.load import load_per_problem

    grid = {"models": ["m"], "main_model": "m", "eval": {"k": 8}, "claims": {"last_checkpoints": 2},
            "tables": {"table2_3": ["grpo", "iac"], "table4": [], "table5": ["grpo", "iac", "filter"],
                       "figure6": []}}  # fmt: skip
    paths = per_problem_files(tmp_path, {"grpo": 0.0, "iac": 0.15, "filter": 0.0}, seeds=4)
    pp = load_per_problem(paths, tmp_path)
    assert len(pp) == 3 * 4 * 2 * 100
    frame = C.finish(C.grid_claims(pp, pd.DataFrame(), grid, reps=400))
    assert list(frame.columns[:10]) == C.COLUMNS
    by = frame.set_index("claim")
    assert by.loc["IAC above grpo (AVG@8, m)", "verdict"] == "holds"
    assert by.loc["IAC above grpo (AVG@8, m)", "seeds"] == 4
    assert 10 < by.loc["IAC above grpo (AVG@8, m)", "estimate"] < 20  # percentage points
    assert by.loc["IAC above filtering (AVG@8)", "verdict"] == "holds"
    assert by.loc["Filtering above GRPO (AVG@8)", "verdict"] == "inconclusive"
    assert (frame["p_holm"].dropna() >= frame["p"].dropna()).all()
