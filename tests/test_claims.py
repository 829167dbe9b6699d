"""The claims' statistics (calibrl.stats, calibrl.report.claims, calibrl.analysis_plan): the paired t test on
per-seed differences, its exact sign-flip fallback, TOST, Holm, the four-way verdicts, power, the plan's checks,
and the claims decided from evaluation files. The calibration against recorded results is in
tests/test_calibration.py."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from calibrl import analysis_plan as AP
from calibrl import stats as S
from calibrl.report import claims as C


def test_holm_matches_hand_computed_values():
    # p sorted 0.01, 0.02, 0.03, 0.04 -> 4*0.01, 3*0.02, 2*0.03, 1*0.04, made monotone
    assert S.holm([0.04, 0.01, 0.03, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    out = S.holm([0.5, float("nan"), 0.001])
    assert out[0] == pytest.approx(0.5) and np.isnan(out[1]) and out[2] == pytest.approx(0.002)


def test_verdicts_are_five_way():
    assert S.verdict(2.0, 0.01) == "holds"
    assert S.verdict(2.0, 0.01, p_equiv=0.3) == "holds"
    assert S.verdict(-2.0, 0.01) == "contradicted"
    assert S.verdict(-2.0, 0.01, direction=-1) == "holds"
    # different from zero and equivalent within the margin: an effect below what matters, either way
    assert S.verdict(0.5, 0.01, p_equiv=0.01) == "negligible"
    assert S.verdict(-0.5, 0.01, p_equiv=0.01) == "negligible"
    assert S.verdict(0.1, 0.6, p_equiv=0.01) == "absent"
    assert S.verdict(2.0, 0.2, p_equiv=0.3) == "inconclusive"
    assert S.verdict(2.0, float("nan")) == "inconclusive"
    assert set(S.VERDICTS) == {"holds", "contradicted", "negligible", "absent", "inconclusive"}


def test_a_verdict_reads_with_its_interval_against_the_margin():
    """A difference found whose 90% interval lies inside the margin reads "holds (below the margin)" (the case a
    plain "holds" hid: P2 of the fourth revision, 90% CI [0.70, 1.97] against +-2); one shown at least the margin
    (minimum-effect p < level) reads so; a negligible one says its side."""
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 1, 24)
    noise = (noise - noise.mean()) / noise.std(ddof=1)  # sd 1: se 0.204 over 24 seeds
    below, large, small_neg = 1.3 + noise, 4.0 + noise, -0.9 + 0.5 * noise
    # the verdicts as Holm leaves them: below's equivalence p (0.001 unadjusted) not significant once adjusted
    for d, direction, v, want in (
        (below, 1, "holds", "holds (below the margin)"),
        (large, 1, "holds", "holds (at least the margin)"),
        (small_neg, 1, "negligible", "negligible (against the claim)"),
        (small_neg, -1, "negligible", "negligible (in the claimed direction)"),
    ):
        e = S.paired(d, margin=2.0)
        assert S.reading(v, e, direction) == want, (want, e)
        low, high, p_min = S.against_margin(e, direction)
        assert low < e.estimate < high and (p_min < 0.05) == (want == "holds (at least the margin)")
    e = S.paired(below, margin=2.0)
    low, high, _ = S.against_margin(e, 1)
    assert -2.0 < low and high < 2.0 and e.p_equiv < 0.05  # the 90% interval inside: TOST's equivalence at 0.05
    assert S.reading("inconclusive", e, 1) == "inconclusive" and S.reading("holds", None, 1) == "holds"


def test_decide_adjusts_over_the_family_and_leaves_missing_claims_undecided():
    rng = np.random.default_rng(0)
    big = 5.0 + rng.normal(0, 1, 16)  # far above a margin of 1
    tiny = 0.3 + rng.normal(0, 0.2, 16)  # clearly above zero, clearly inside +-1
    none = rng.normal(0, 0.2, 16)
    none -= none.mean()  # no difference at all
    d = S.decide([big, tiny, none, None], [1.0] * 4, [1, 1, -1, 1])
    assert d.verdicts == ["holds", "negligible", "absent", "inconclusive"]
    alone = [S.paired(x, 1.0) for x in (big, tiny, none)]
    assert d.p_holm[:3] == pytest.approx(S.holm([e.p for e in alone]))
    assert d.p_equiv_holm[:3] == pytest.approx(S.holm([e.p_equiv for e in alone]))
    assert d.estimates[3] is None and np.isnan(d.p_holm[3])


def test_paired_t_and_tost_match_scipy():
    d = np.array([1.2, -0.3, 2.5, 0.8, 1.9, 0.1, 1.4, 0.6])
    e = S.paired(d, margin=3.0)
    ref = st.ttest_1samp(d, 0.0)
    assert e.p == pytest.approx(ref.pvalue) and e.seeds == 8
    assert e.ci_low < d.mean() < e.ci_high
    lo, hi = st.ttest_1samp(d, -3.0, alternative="greater"), st.ttest_1samp(d, 3.0, alternative="less")
    assert e.p_equiv == pytest.approx(max(lo.pvalue, hi.pvalue))


def test_zero_variance_is_the_exact_sign_flip_test_not_p_zero():
    assert S.paired(np.full(4, 0.5)).p == pytest.approx(2 / 2**4)  # all flips but two give a smaller |mean|
    assert S.paired(np.zeros(6), margin=1.0).p == 1.0
    assert S.paired(np.zeros(6), margin=1.0).p_equiv == pytest.approx(2**-6)  # the one-sided sign tests
    # sums of +-1 +-2 +-0.5: 3.5, 2.5, 1.5, 0.5 and their negatives; 4 of 8 reach the observed 2.5
    assert S.signflip_p(np.array([1.0, 2.0, -0.5])) == pytest.approx(4 / 8)


def test_one_seed_is_never_decided():
    e = S.paired(np.array([3.0]), margin=1.0)
    assert e.seeds == 1 and np.isnan(e.p) and S.verdict(e.estimate, e.p, e.p_equiv) == "inconclusive"


def test_a_secondary_family_is_decided_after_the_primaries_with_holm_within_it(tmp_path):
    """The plan's secondary claims (here: the primaries' comparisons on ood alone) are decided as the primaries, in
    their own family (Holm within it: the primaries' p-values do not change), labelled "secondary"."""
    from calibrl.report.load import load_per_problem

    grid = {"models": ["m"], "main_model": "m", "eval": {"k": 8}, "claims": {"last_checkpoints": 2},
            "tables": {"table2_3": ["grpo", "iac"], "table4": [], "table5": [], "figure6": []},
            "data": {"source": "countdown", "seed": 0, "eval_splits": ["test", "ood"]}}  # fmt: skip
    secondary = """secondary:
  - {id: S1, claim: IAC above GRPO on ood, arms: [iac, grpo], metric: avg_at_8, checkpoints: 2, direction: above,
     margin: 2.0, splits: {ood: 1}}
  - {id: S2, claim: filtering above GRPO on ood, arms: [filter, grpo], metric: avg_at_8, checkpoints: 2,
     direction: above, margin: 5.0, splits: {ood: 1}}
"""
    (tmp_path / "plan.yaml").write_text(PLAN)
    alone = AP.load(tmp_path / "plan.yaml")
    (tmp_path / "plan.yaml").write_text(PLAN + secondary)
    plan = AP.load(tmp_path / "plan.yaml")
    assert [c.id for c in plan.claims()] == ["P1", "P2", "P3", "S1", "S2"] and plan.arms() == alone.arms()
    paths = per_problem_files(tmp_path, {"grpo": 0.0, "iac": 0.15, "filter": 0.0}, seeds=list(plan.seeds))
    pp = load_per_problem([*paths, *base_files(tmp_path, plan.seeds, distinct=3)], tmp_path)
    by = C.grid_claims(pp, pd.DataFrame(), grid, plan).set_index("claim")
    s1, s2 = by.loc["S1: IAC above GRPO on ood"], by.loc["S2: filtering above GRPO on ood"]
    assert s1["role"] == s2["role"] == "secondary" and s1["verdict"] == "holds" and s2["verdict"] != "holds"
    low, high = sorted((s1["p"], s2["p"]))  # Holm over the two of the family, not over five
    assert sorted((s1["p_holm"], s2["p_holm"])) == pytest.approx([2 * low, max(2 * low, high)])
    primaries = [f"{c.id}: {c.claim}" for c in plan.primaries]
    assert not [c for c in by.index if " beside: " in c]  # no claim on the reallocation reading: nothing beside
    (tmp_path / "plan.yaml").write_text(PLAN)  # the same seeds' files: the primaries as if there were no secondaries
    repl = {s: t for s, t in zip(plan.seeds, alone.seeds)}
    moved = pp.assign(seed=pp["seed"].map(repl))
    without = C.grid_claims(moved, pd.DataFrame(), grid, alone).set_index("claim")
    assert np.allclose(by.loc[primaries, "p_holm"], without.loc[primaries, "p_holm"])


def test_a_reallocation_claim_has_the_decline_and_the_plain_reading_beside_it(tmp_path):
    """A plan claim on Definition 2.1's reallocation reading: decided on it, with the same comparison on the plain
    decline and on any fall printed beside it as exploratory rows (so the choice of reading hides nothing). The
    files' modes: GRPO's "3*5" falls on 60% of problems while "3+12" stays (declined), IAC's on 20%."""
    from calibrl.report.load import load_per_problem

    grid = {"models": ["m"], "main_model": "m", "eval": {"k": 8}, "claims": {"last_checkpoints": 2},
            "tables": {"table2_3": ["grpo", "iac"], "table4": [], "table5": [], "figure6": []},
            "data": {"source": "countdown", "seed": 0, "eval_splits": ["test", "ood"]}}  # fmt: skip
    realloc = "  - {id: P4, claim: IAC reallocates less, arms: [iac, grpo], metric: reallocated, checkpoints: 2,\n"
    realloc += "     direction: below, margin: 5.0}\n"
    (tmp_path / "plan.yaml").write_text(PLAN + realloc)
    plan = AP.load(tmp_path / "plan.yaml")
    paths = per_problem_files(tmp_path, {"grpo": 0.0, "iac": 0.15, "filter": 0.0}, seeds=list(plan.seeds))
    pp = load_per_problem([*paths, *base_files(tmp_path, plan.seeds, distinct=3)], tmp_path)
    by = C.grid_claims(pp, pd.DataFrame(), grid, plan).set_index("claim")
    p4 = by.loc["P4: IAC reallocates less"]
    assert p4["role"] == "primary" and p4["estimate"] == 0.0  # no mode rose: nothing reallocated under either arm
    declined = by.loc["P4 beside: iac below grpo on the share of problems declined (Definition 2.1)"]
    fell = by.loc["P4 beside: iac below grpo on the share of problems oversharpened (Definition 2.1)"]
    assert declined["role"] == fell["role"] == "exploratory" and np.isnan(declined["p_holm"])
    assert declined["verdict"] == "holds" and -50 < declined["estimate"] < -30  # 20% against 60% of problems
    assert fell["estimate"] == pytest.approx(declined["estimate"])  # every fall here is a decline


def test_power_matches_a_simulation():
    rng = np.random.default_rng(0)
    sims = rng.normal(1.0, 2.0, size=(4000, 12))
    rate = np.mean(st.ttest_1samp(sims, 0.0, axis=1).pvalue < 0.05)
    assert S.power(2.0, 1.0, 12) == pytest.approx(rate, abs=0.025)
    assert S.power(2.0, 1.0, S.seeds_needed(2.0, 1.0)) >= 0.8 > S.power(2.0, 1.0, S.seeds_needed(2.0, 1.0) - 1)


PLAN = """
level: 0.05
replication: {data_seeds: 3, training_seeds: 2}
design: {seeds: [7], data_seeds: [0]}
splits: {test: 1, ood: 1}
primary:
  - {id: P1, claim: IAC above GRPO, arms: [iac, grpo], metric: avg_at_8, checkpoints: 2, direction: above,
     margin: 2.0}
  - {id: P2, claim: filtering above GRPO, arms: [filter, grpo], metric: avg_at_8, checkpoints: 2,
     direction: above, margin: 5.0}
  - {id: P3, claim: GRPO below base in distinct answers, arms: [grpo, base], metric: distinct, checkpoints: 1,
     direction: below, margin: 0.05, unit: answers}
"""


def test_the_plan_draws_its_seeds_from_its_own_bytes(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    plan = AP.load(path)
    assert len(plan.data_seeds) == 3 and len(plan.seeds) == 6 and len(set(plan.seeds) | set(plan.data_seeds)) == 9
    assert all(AP.SEED_RANGE[0] <= s < AP.SEED_RANGE[1] for s in (*plan.seeds, *plan.data_seeds))
    assert {plan.data_of[s] for s in plan.seeds} == set(plan.data_seeds)
    assert [list(plan.data_of.values()).count(d) for d in plan.data_seeds] == [2, 2, 2]  # nested, balanced
    assert AP.load(path).seeds == plan.seeds  # the same bytes, the same seeds, on any machine
    assert plan.seeds[:2] == tuple(AP.derive_seeds(plan.sha256, 3, 2, {7, 0})[plan.data_seeds[0]])
    path.write_text(PLAN + "# a comment\n")  # any edit draws new seeds
    edited = AP.load(path)
    assert edited.sha256 != plan.sha256 and not set(edited.seeds) & set(plan.seeds)
    # a drawn seed never equals a design seed
    assert not set(AP.derive_seeds(plan.sha256, 3, 2, exclude=set(plan.seeds[:3]))[plan.data_seeds[0]]) & set(
        plan.seeds[:3]
    )


def test_the_plan_refuses_listed_seeds_and_other_plans_results(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN + "seeds: [0, 1, 2]\n")
    with pytest.raises(AP.PlanError, match=r"seeds and data_seed are drawn from the plan's own SHA-256"):
        AP.load(path)
    path.write_text(PLAN.replace("data_seeds: 3,", "data_seeds: 1,"))
    with pytest.raises(AP.PlanError, match=r"at least 2 data seeds"):
        AP.load(path)
    path.write_text(PLAN + "alpha: 0.05\n")
    with pytest.raises(AP.PlanError, match=r"plan.yaml: unknown key\(s\) \['alpha'\]"):
        AP.load(path)
    path.write_text(PLAN.replace("metric: distinct", "metric: distinct, on ood"))  # a comma starts a key
    with pytest.raises(AP.PlanError, match=r"primary\[2\]: unknown key\(s\) \['on ood'\].*quote the value"):
        AP.load(path)
    path.write_text(PLAN.replace("metric: distinct", "metric: pass@8"))
    with pytest.raises(AP.PlanError, match="primary\\[2\\]: metric 'pass@8'"):
        AP.load(path)
    path.write_text(PLAN)
    plan = AP.load(path)
    AP.check_records(plan, {"a.json": plan.sha256})
    with pytest.raises(AP.PlanError, match="1 result file\\(s\\) were made under another analysis plan.*b.json"):
        AP.check_records(plan, {"a.json": plan.sha256, "b.json": "0" * 64})
    grid = {"seed": 0, "extra_seeds": {"filter": [1, plan.seeds[2]]}, "methods": {"iac": {}, "grpo": {}, "filter": {}},
            "data": {"seed": 1, "source": "countdown", "eval_splits": ["test", "ood"]}, "eval": {"n": 8}}  # fmt: skip
    with pytest.raises(AP.PlanError, match=rf"seeds \[{plan.seeds[2]}\] are drawn by the plan"):
        AP.check_config(plan, grid)
    grid["extra_seeds"] = {"filter": [1, 2]}
    AP.check_config(plan, grid)
    del grid["methods"]["filter"]
    with pytest.raises(AP.PlanError, match="primary arm 'filter' is not in grid.methods"):
        AP.check_config(plan, grid)


def test_the_plan_weighs_its_splits_and_measures_over_sharpening(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.replace("splits: {test: 1, ood: 1}\n", ""))
    with pytest.raises(AP.PlanError, match=r"primary\[0\]: splits: give the evaluation splits' weights"):
        AP.load(path)
    path.write_text(PLAN.replace("splits: {test: 1, ood: 1}", "splits: {test: 1, ood: -1}"))
    with pytest.raises(AP.PlanError, match=r"weights must be numbers >= 0"):
        AP.load(path)
    over = "  - {id: P4, claim: GRPO over-sharpens, arms: [grpo, base], metric: oversharpened, factor: 0.5,\n"
    over += "     splits: {train: 1}, direction: above, margin: 10.0}\n"
    path.write_text(PLAN + over)
    plan = AP.load(path)
    assert plan.primaries[0].weights() == {"test": 1.0, "ood": 1.0}  # the plan's, by default
    assert plan.primaries[3].weights() == {"train": 1.0} and plan.primaries[3].factor == 0.5
    assert plan.primaries[3].scale == 100.0 and plan.primaries[3].k() is None  # points of problems
    grid = {"seed": 0, "extra_seeds": {}, "methods": {"iac": {}, "grpo": {}, "filter": {}},
            "data": {"seed": 1, "source": "countdown", "eval_splits": ["test", "ood"]}, "eval": {"n": 8}}  # fmt: skip
    with pytest.raises(AP.PlanError, match=r"P4 weighs splits \['train'\] that grid.data.eval_splits does not"):
        AP.check_config(plan, grid)
    path.write_text(PLAN + "step: 50\n")  # the checkpoint the primaries read, fixed in the plan
    grid["train"], grid["data"]["eval_splits"] = {"steps": 40}, ["train", "test", "ood"]
    with pytest.raises(AP.PlanError, match=r"grid.train.steps is 40: the plan .* decides at step 50"):
        AP.check_config(AP.load(path), grid)
    grid["train"]["steps"] = 50
    AP.check_config(AP.load(path), grid)
    path.write_text(PLAN.replace("margin: 5.0}", "margin: 5.0, factor: 0.5}"))
    with pytest.raises(AP.PlanError, match=r"primary\[1\]: factor 0.5 is a share in \(0, 1\], for metric"):
        AP.load(path)


# the base model's two correct modes per problem; a run's mode "3*5" falls below it on a share of the problems
BASE_MODES = {"3*5": -1.0, "3+12": -2.0}
SUPPRESSED = {"grpo": 0.6, "iac": 0.2, "filter": 0.6}


def per_problem_files(res: Path, effects: dict[str, float], seeds: list[int], n: int = 8) -> list[str]:
    """Evaluation files with per-problem results: method m solves problems at rate 0.4 + effects[m] + seed noise,
    and on a share SUPPRESSED[m] of the problems one correct mode is less likely than under the base model."""
    rng = np.random.default_rng(0)
    paths = []
    for method, effect in effects.items():
        for seed in seeds:
            u = np.random.default_rng(100 + seed).normal(0, 0.02)  # shared by arms: common random numbers
            for step in (50, 100):
                splits = {}
                for split, size in (("test", 60), ("ood", 40)):
                    correct = rng.binomial(n, np.clip(0.4 + effect + u, 0, 1), size).tolist()
                    fell = rng.random(size) < SUPPRESSED[method]
                    modes = [{**BASE_MODES, "3*5": -1.5 if f else -0.5} for f in fell]
                    splits[split] = {
                        "avg_at_8": float(np.mean(correct)) / n,
                        "pass_at_8": 0.0,
                        "n_samples": n,
                        "per_problem": {"correct": correct, "distinct": [min(c, 2) for c in correct], "modes": modes},
                    }
                path = res / "runs" / "m" / method / f"s{seed}" / "eval" / f"step_{step}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps({"step": step, "splits": splits}))
                paths.append(str(path))
    return paths


def base_files(res: Path, seeds: list[int], distinct: int, n: int = 8) -> list[str]:
    """The base model's step-0 evaluations, one per seed: ``distinct`` correct answers on every problem."""
    rng = np.random.default_rng(1)
    paths = []
    for seed in seeds:
        splits = {}
        for split, size in (("test", 60), ("ood", 40)):
            correct = rng.binomial(n, 0.4, size).tolist()
            per = {"correct": correct, "distinct": [distinct] * size, "modes": [BASE_MODES] * size}
            splits[split] = {"n_samples": n, "per_problem": per}
        path = res / "runs" / "m" / "base" / f"s{seed}" / "eval" / "step_0.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": 0, "splits": splits}))
        paths.append(str(path))
    return paths


def test_claims_from_files_hold_for_a_real_effect_and_are_absent_for_none(tmp_path):
    from calibrl.report.load import load_per_problem

    grid = {"models": ["m"], "main_model": "m", "eval": {"k": 8}, "claims": {"last_checkpoints": 2},
            "tables": {"table2_3": ["grpo", "iac"], "table4": [], "table5": ["grpo", "iac", "filter"],
                       "figure6": []},
            "data": {"source": "countdown", "seed": 0, "eval_splits": ["test", "ood"]}}  # fmt: skip
    (tmp_path / "plan.yaml").write_text(PLAN)
    plan = AP.load(tmp_path / "plan.yaml")
    paths = per_problem_files(tmp_path, {"grpo": 0.0, "iac": 0.15, "filter": 0.0}, seeds=list(plan.seeds))
    paths += base_files(tmp_path, plan.seeds, distinct=3)  # every run has at most 2: below the base by > 1 answer
    pp = load_per_problem(paths, tmp_path)
    assert len(pp) == (3 * 6 * 2 + 6) * 100
    frame = C.grid_claims(pp, pd.DataFrame(), grid, plan)
    assert list(frame.columns) == C.COLUMNS and (frame["plan_sha256"] == plan.sha256).all()
    by = frame.set_index("claim")
    p1, p2, p3 = (by.loc[f"{c.id}: {c.claim}"] for c in plan.primaries)
    assert p1["role"] == "primary" and p1["verdict"] == "holds" and p1["seeds"] == 6 and p1["df"] == 2  # 3 data seeds
    assert 10 < p1["estimate"] < 20  # percentage points
    assert p2["verdict"] == "absent"  # no effect, measured to within +-5 points (seed sd here: ~2.5 points)
    assert p3["verdict"] == "holds" and p3["estimate"] < -1
    assert (frame["p_holm"].dropna() >= frame["p"].dropna()[frame["role"] == "primary"]).all()
    # the primaries are not repeated as exploratory rows; the rest are, unadjusted
    assert "IAC above grpo (AVG@8, m)" not in by.index
    assert by.loc["IAC above filtering (AVG@8)", "role"] == "exploratory"
    assert by.loc["IAC above filtering (AVG@8)", "verdict"] == "holds"
    assert np.isnan(by.loc["IAC above filtering (AVG@8)", "p_holm"])
    # Definition 2.1 from the measured modes: GRPO over-sharpens on ~60% of the problems, IAC on ~20%
    less = by.loc[[c for c in by.index if c.startswith("IAC over-sharpens less than GRPO")][0]]
    assert less["verdict"] == "holds" and 30 < less["estimate"] < 50 and less["df"] == 2, less  # over data seeds
    # a missing planned seed leaves every primary undecided
    fewer = C.grid_claims(pp[pp["seed"] != plan.seeds[-1]], pd.DataFrame(), grid, plan).set_index("claim")
    assert (fewer.loc[[f"{c.id}: {c.claim}" for c in plan.primaries], "verdict"] == "inconclusive").all()
    assert "1 of the plan's 6 seeds missing" in fewer.loc["P1: IAC above GRPO", "note"]
