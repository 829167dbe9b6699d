"""The toy simulation: determinism, outputs, and the CLI."""

import subprocess
import sys

import pandas as pd
import pytest

from calibrl.toy.figures import collapse_stats, figure_settings
from calibrl.toy.sim import ToySetting, run

SMALL = dict(steps=30, seeds=8, record_every=10)


def test_deterministic_for_a_seed_and_different_across_seeds():
    s = ToySetting(estimator="raw", group_size=4, **SMALL)
    a, b = run(s), run(s)
    pd.testing.assert_frame_equal(a, b)
    c = run(ToySetting(estimator="raw", group_size=4, seed=1, **SMALL))
    assert not a.equals(c)


def test_rows_and_probabilities():
    frame = run(ToySetting(estimator="norm", group_size=8, siamese="mid", **SMALL))
    assert list(frame.columns) == [
        "seed",
        "step",
        "p_cat",
        "p_dog",
        "p_persian",
        "p_siamese",
        "p_siamese_heldout",
    ]
    assert len(frame) == 8 * 4  # steps 0, 10, 20, 30
    probs = frame[["p_cat", "p_dog", "p_persian", "p_siamese"]].sum(axis=1)
    assert ((probs - 1).abs() < 1e-9).all()
    start = frame[frame.step == 0]
    assert (start[["p_cat", "p_dog", "p_persian", "p_siamese"]] == 0.25).all().all()  # zero init = uniform


def test_training_moves_mass_to_the_rewarded_labels():
    frame = run(ToySetting(estimator="raw", group_size=8, steps=100, seeds=16, record_every=50))
    end = frame[frame.step == 100]
    assert (end.p_cat + end.p_persian).mean() > 0.9


def test_warm_init_matches_its_targets():
    frame = run(ToySetting(init="warm", siamese="high", **SMALL))
    start = frame[frame.step == 0].iloc[0]
    assert start.p_cat == pytest.approx(0.4) and start.p_persian == pytest.approx(0.4)
    assert start.p_siamese_heldout == pytest.approx(0.4)


def test_iac_with_raw_rewards_freezes_all_correct_groups():
    # raw rewards + IAC: an all-correct group has factor (G - G)^alpha = 0, so once the policy only
    # samples correct labels nothing moves; without IAC the all-correct groups keep sharpening.
    steps = dict(steps=400, seeds=64, record_every=400)
    base = collapse_stats(run(ToySetting(estimator="raw", group_size=4, **steps)), 400)
    calib = collapse_stats(run(ToySetting(estimator="raw", group_size=4, iac_alpha=1.0, **steps)), 400)
    assert calib["dominance_end"] < base["dominance_end"]


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="optimizer"):
        ToySetting(optimizer="rmsprop")
    with pytest.raises(ValueError, match="siamese"):
        ToySetting(siamese="very-high")


def test_figure_grids_have_the_paper_factors():
    cfg = dict(
        estimator="raw",
        lr={"sgd": 0.5, "momentum": 0.5, "adamw": 0.05},
        steps=10,
        seeds=2,
        seed=0,
        init="zero",
        memory_lr=0.5,
        momentum=0.9,
        weight_decay=0.01,
        record_every=5,
        group_sizes=[4, 8, 16],
        iac_alpha=1.0,
        dlc_mu=0.5,
        fig5_estimators=["raw"],
        fig5_optimizers=["sgd", "adamw"],
    )
    fig2 = list(figure_settings("fig2", cfg))
    assert {f["siamese"] for f, _ in fig2} == {"high", "mid", "low"}
    fig5 = {(f["variant"], s.iac_alpha, s.dlc_mu) for f, s in figure_settings("fig5", cfg)}
    assert fig5 == {("baseline", 0.0, 0.0), ("iac", 1.0, 0.0), ("iac+dlc", 1.0, 0.5)}
    adamw = [s for f, s in figure_settings("fig4", cfg) if f["optimizer"] == "adamw"]
    assert all(s.lr == 0.05 for s in adamw)


def test_cli_writes_one_row_per_seed_and_step(tmp_path):
    out = tmp_path / "run.csv"
    cmd = [
        sys.executable,
        "-m",
        "calibrl.cli",
        "toy",
        "--estimator",
        "rloo",
        "--group-size",
        "4",
        "--optimizer",
        "adamw",
        "--lr",
        "0.05",
        "--steps",
        "20",
        "--seeds",
        "5",
        "--siamese",
        "low",
        "--iac-alpha",
        "1",
        "--dlc-mu",
        "0.5",
        "--record-every",
        "10",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    frame = pd.read_csv(out)
    assert len(frame) == 5 * 3 and "p_siamese_heldout" in frame
    help_text = subprocess.run(
        [sys.executable, "-m", "calibrl.cli", "toy", "--help"], check=True, capture_output=True, text=True
    ).stdout
    for option in (
        "--estimator",
        "--group-size",
        "--optimizer",
        "--lr",
        "--steps",
        "--seeds",
        "--init",
        "--iac-alpha",
        "--dlc-mu",
        "--siamese",
        "--out",
    ):
        assert option in help_text
    bad = subprocess.run(cmd[:4] + ["--estimator", "nope", "--out", str(out)], capture_output=True, text=True)
    assert bad.returncode != 0 and "--estimator must be one of" in bad.stderr


# ---------------------------------------------------------------------------------------------- verdicts
def _fake_seeds(values: dict[str, list[float]], metric: str = "dominance_auc") -> pd.DataFrame:
    """A per-seed frame of fig5-like configurations (variant -> per-seed values of ``metric``)."""
    rows = []
    for variant, xs in values.items():
        for seed, x in enumerate(xs):
            rows.append(dict(estimator="raw", optimizer="sgd", variant=variant, siamese="", group_size=4, seed=seed,
                             **{metric: x}))  # fmt: skip
    return pd.DataFrame(rows)


def test_toy_comparison_is_paired_and_three_way():
    from calibrl.toy import verdicts as V

    rng = pd.Series(range(64)).map(lambda s: (s * 7919 % 101) / 101)  # a spread shared by both configurations
    base = (0.8 + 0.1 * rng).tolist()
    frame = _fake_seeds({"baseline": base, "iac": [x - 0.02 for x in base]})
    a, b = dict(variant="iac"), dict(variant="baseline")
    faster = V._compare("iac", "ctx", frame, "dominance_auc", a, b, "iac", "baseline", False)
    # every seed is 0.02 lower: paired, the difference has no spread at all (unpaired SEs would see 0.03)
    assert faster["estimate"] == pytest.approx(0.02) and faster["p"] == 0.0
    slower = V._compare("iac", "ctx", frame, "dominance_auc", a, b, "iac", "baseline", True)
    assert slower["estimate"] == pytest.approx(-0.02)  # the claimed direction reversed: negative estimate
    same = V._compare("iac", "ctx", _fake_seeds({"baseline": base, "iac": base}), "dominance_auc", a, b, "", "",
                      False)  # fmt: skip
    assert same["estimate"] == 0 and same["p"] == 1.0


def test_toy_threshold_is_contrasted_with_its_baseline():
    from calibrl.toy import verdicts as V

    # both configurations leave no seed collapsed: the threshold "<= 0.05" is met, but not because of the method
    frame = _fake_seeds({"baseline": [0.0] * 32, "iac+dlc": [0.0] * 32}, metric="collapsed_end")
    rows = V._against_baseline("iac_dlc", "ctx", frame, "collapsed_end", dict(variant="iac+dlc"),
                               dict(variant="baseline"), "<=", 0.05)  # fmt: skip
    comp = pd.DataFrame(rows).assign(p_holm=lambda f: f["p"])
    sig = comp["p_holm"] < 0.05
    assert not (sig & (comp["estimate"] > 0) & comp["comparison"].str.contains("baseline")).any()


def test_toy_verdicts_on_a_small_run():
    from calibrl.toy import verdicts as V
    from calibrl.toy.figures import run_figure

    cfg = dict(estimator="raw", lr={"sgd": 0.5, "momentum": 0.5, "adamw": 0.05}, steps=60, seeds=16, seed=0,
               init="zero", memory_lr=0.5, momentum=0.9, weight_decay=0.01, record_every=20, group_sizes=[4, 16],
               iac_alpha=1.0, dlc_mu=0.5, fig5_estimators=["raw", "norm"], fig5_optimizers=["sgd"])  # fmt: skip
    seeds = {fig: V.per_seed(run_figure(fig, cfg)[0]) for fig in ("fig1", "fig2", "fig3", "fig4", "fig5")}
    comp = V.comparisons(seeds)
    assert set(comp["outcome"]) <= {"holds", "contradicted", "inconclusive"}
    assert (comp["p_holm"] >= comp["p"] - 1e-12).all()
    summary = V.verdicts(comp)
    assert list(summary["claim"]) == list(V.CLAIMS)
    assert set(summary["verdict"]) <= {"holds", "contradicted", "inconclusive"}
    rows = V.claims_rows(comp)
    assert len(rows) == len(V.CLAIMS) and (rows["seeds"] == 16).all()
    assert (rows["ci_low"] <= rows["estimate"]).all() and (rows["estimate"] <= rows["ci_high"]).all()
