"""The toy simulation: determinism, outputs, and the CLI."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from calibrl.config import filled
from calibrl.toy.figures import collapse_stats, figure_settings, toy_setting
from calibrl.toy.sim import run

SMALL = dict(steps=30, seeds=8, record_every=10)
TOY = filled("toy", {})  # the schema's defaults, as calibrl toy runs them


def toy(**overrides):
    return toy_setting(TOY, **overrides)


def test_deterministic_for_a_seed_and_different_across_seeds():
    s = toy(estimator="raw", group_size=4, **SMALL)
    a, b = run(s), run(s)
    pd.testing.assert_frame_equal(a, b)
    c = run(toy(estimator="raw", group_size=4, seed=1, **SMALL))
    assert not a.equals(c)


def test_rows_and_probabilities():
    frame = run(toy(estimator="norm", group_size=8, siamese="mid", **SMALL))
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
    frame = run(toy(estimator="raw", group_size=8, steps=100, seeds=16, record_every=50))
    end = frame[frame.step == 100]
    assert (end.p_cat + end.p_persian).mean() > 0.9


def test_warm_init_matches_its_targets():
    frame = run(toy(init="warm", siamese="high", **SMALL))
    start = frame[frame.step == 0].iloc[0]
    assert start.p_cat == pytest.approx(0.4) and start.p_persian == pytest.approx(0.4)
    assert start.p_siamese_heldout == pytest.approx(0.4)


def test_iac_with_raw_rewards_freezes_all_correct_groups():
    # raw rewards + IAC: an all-correct group has factor (G - G)^alpha = 0, so once the policy only
    # samples correct labels nothing moves; without IAC the all-correct groups keep sharpening.
    steps = dict(steps=400, seeds=64, record_every=400)
    base = collapse_stats(run(toy(estimator="raw", group_size=4, **steps)), 400)
    calib = collapse_stats(run(toy(estimator="raw", group_size=4, iac_alpha=1.0, **steps)), 400)
    assert calib["dominance_end"] < base["dominance_end"]


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="optimizer"):
        toy(optimizer="rmsprop")
    with pytest.raises(ValueError, match="siamese"):
        toy(siamese="very-high")


def test_figure_grids_have_the_paper_factors():
    cfg = dict(
        estimator="raw",
        lr={"sgd": 0.5, "momentum": 0.5, "adamw": 0.05},
        lr_scales=[0.5, 2.0],
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
    assert len(fig2) == 3 * 3 * 2  # every configuration at every learning rate of the range
    fig5 = {(f["variant"], s.iac_alpha, s.dlc_mu) for f, s in figure_settings("fig5", cfg)}
    assert fig5 == {("baseline", 0.0, 0.0), ("iac", 1.0, 0.0), ("iac+dlc", 1.0, 0.5)}
    lrs = {(f["optimizer"], f["lr_scale"], s.lr) for f, s in figure_settings("fig4", cfg)}
    assert {(o, x, lr) for o, x, lr in lrs if o == "adamw"} == {("adamw", 0.5, 0.025), ("adamw", 2.0, 0.1)}
    assert {(o, x, lr) for o, x, lr in lrs if o == "sgd"} == {("sgd", 0.5, 0.25), ("sgd", 2.0, 1.0)}


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
    # every seed is 0.02 lower: paired, the difference has no spread at all (unpaired SEs would see 0.03); t is
    # undefined there, and the exact sign test gives 2^-(n-1) for 64 differences of one sign
    assert faster["estimate"] == pytest.approx(0.02) and faster["p"] == pytest.approx(2.0**-63)
    assert faster["test"] == "sign" and faster["ci_low"] == faster["ci_high"] == pytest.approx(0.02)
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

    cfg = dict(estimator="raw", lr={"sgd": 0.5, "momentum": 0.5, "adamw": 0.05}, lr_scales=[0.5, 2.0], steps=60,
               seeds=16, seed=0, init="zero", memory_lr=0.5, momentum=0.9, weight_decay=0.01, record_every=20,
               group_sizes=[4, 16], iac_alpha=1.0, dlc_mu=0.5, fig5_estimators=["raw", "norm"],
               fig5_optimizers=["sgd"])  # fmt: skip
    seeds = {fig: V.per_seed(run_figure(fig, cfg)[0]) for fig in ("fig1", "fig2", "fig3", "fig4", "fig5")}
    comp = V.comparisons(seeds)
    assert set(comp["outcome"]) <= set(V.OUTCOMES)
    assert (comp["p_holm"] >= comp["p"] - 1e-12).all()
    # every comparison at both learning rates, Holm over both within each claim
    assert sorted(comp["lr_scale"].unique()) == [0.5, 2.0]
    per_scale = comp.groupby(["claim", "lr_scale"]).size().unstack()
    assert (per_scale[0.5] == per_scale[2.0]).all()
    summary = V.verdicts(comp)
    assert list(summary["claim"]) == list(V.CLAIMS)
    assert set(summary["verdict"]) <= set(V.OUTCOMES)
    assert summary["per_lr"].str.contains("x0.5 ").all() and summary["per_lr"].str.contains("x2 ").all()
    note = V.range_note(cfg)
    assert note == "over lr x{0.5, 2} (sgd {0.25, 1}; momentum {0.25, 1}; adamw {0.025, 0.1}), 60 steps"
    rows = V.claims_rows(comp, note)
    assert list(rows.columns[:11]) == ["claim", "source", "quantity", "estimate", "ci_low", "ci_high", "seeds", "p",
                                       "verdict", "role", "note"]  # fmt: skip
    assert len(rows) == len(V.CLAIMS) and (rows["seeds"] == 16).all()
    assert (rows["source"] == "toy").all() and (rows["role"] == "exploratory").all()
    assert list(rows["verdict"]) == list(summary["verdict"])
    assert rows["note"].str.startswith(note).all()
    assert (rows["ci_low"] <= rows["estimate"]).all() and (rows["estimate"] <= rows["ci_high"]).all()


# ------------------------------------------------------------------------------- zero spread, exact tests
def test_zero_spread_is_decided_by_an_exact_test_not_a_division_by_zero():
    """Per-seed differences that are all equal have standard error 0: a t or z test divides by zero. The exact sign
    test decides instead: p = 1 when every difference is 0, 2^-(n-1) when all n share one non-zero value, so
    three seeds can never be significant however large their common difference."""
    from calibrl.toy import verdicts as V

    three = V._test("c", "ctx", "a > b", "dominance_auc", pd.Series([0.3, 0.3, 0.3]), 1)
    assert three["p"] == pytest.approx(0.25) and three["test"] == "sign"  # 2^-(3-1): not significant
    zero = V._test("c", "ctx", "a > b", "dominance_auc", pd.Series([0.0] * 40), 1)
    assert zero["p"] == 1.0 and zero["estimate"] == 0
    # every seed collapsed in both arms: difference exactly 0 on the 0/1 metric (McNemar: no discordant seed)
    frame = _fake_seeds({"baseline": [1.0] * 40, "iac+dlc": [1.0] * 40}, metric="collapsed_end")
    both = V._compare("iac_dlc", "ctx", frame, "collapsed_end", dict(variant="iac+dlc"), dict(variant="baseline"),
                      "claimed", "baseline", False)  # fmt: skip
    assert both["p"] == 1.0 and both["test"] == "mcnemar"
    # differences equal up to rounding (0 - 0.05 per seed) count as no spread: no z of 1e17
    rounded = pd.Series([0.1 + 0.2 - 0.3] * 20 + [5.551115123125783e-17] * 20) - 0.05
    assert V._test("c", "ctx", "x", "dominance_end", rounded, -1, bound=0.05)["test"] == "sign"

    comp = pd.DataFrame([{**r, "lr_scale": 1.0} for r in (three, zero, both)])
    comp["p_holm"], comp["p_equiv_holm"] = comp["p"], comp["p_equiv"]
    assert not set(V.outcomes(comp)) & {"holds", "contradicted"}


def test_a_fraction_of_seeds_against_a_bound_uses_the_exact_binomial_test():
    from scipy import stats as st

    from calibrl.toy import verdicts as V

    none_collapsed = pd.Series([0.0] * 100) - 0.05  # "at most 5% collapsed", and none did
    r = V._test("c", "ctx", "collapsed_end <= 0.05", "collapsed_end", none_collapsed, -1, bound=0.05)
    assert r["test"] == "binomial" and r["p"] == pytest.approx(st.binomtest(0, 100, 0.05).pvalue)
    assert r["estimate"] == pytest.approx(0.05) and r["ci_low"] > 0  # exact (Clopper-Pearson) interval
    half = pd.Series([1.0] * 50 + [0.0] * 50) - 0.5  # "at least half collapse", and exactly half did
    assert V._test("c", "ctx", "x", "collapsed_end", half, 1, bound=0.5)["p"] == pytest.approx(1.0)


def test_equivalence_makes_a_comparison_absent():
    from calibrl.toy import verdicts as V

    rng = np.random.default_rng(0)
    tiny = pd.Series(0.001 + 0.01 * rng.standard_normal(400))  # well inside the 0.01 margin
    r = V._test("c", "ctx", "a > b", "dominance_auc", tiny, 1)
    comp = pd.DataFrame([{**r, "p_holm": r["p"], "p_equiv_holm": r["p_equiv"]}])
    assert r["p_equiv"] < 0.05 and V.outcomes(comp)[0] == "absent"
    big = pd.Series(0.05 + 0.01 * rng.standard_normal(400))
    r = V._test("c", "ctx", "a > b", "dominance_auc", big, 1)
    assert r["p_equiv"] > 0.5 and r["p"] < 1e-10


# ---------------------------------------------------------------------------- the learning-rate range rule
def _comp(outcomes: dict[float, list[str]], claim: str = "G") -> pd.DataFrame:
    """A comparisons frame of one claim: per learning-rate scale, the outcomes of its comparisons."""
    signs = {"holds": 1, "contradicted": -1, "absent": 0, "inconclusive": 0}
    rows = []
    for scale, outs in outcomes.items():
        for i, out in enumerate(outs):
            rows.append(dict(claim=claim, context=f"ctx{i}", comparison="a > b", metric="dominance_auc",
                             estimate=0.05 * signs[out], se=0.01, ci_low=-1.0, ci_high=1.0, test="t", seeds=64,
                             min_effect=0.01, lr_scale=scale, outcome=out,
                             p=1e-6 if out in ("holds", "contradicted") else 0.5,
                             p_equiv=1e-4 if out == "absent" else 0.9))  # fmt: skip
    comp = pd.DataFrame(rows)
    comp["p_holm"], comp["p_equiv_holm"] = comp["p"], comp["p_equiv"]
    return comp


@pytest.mark.parametrize(
    "outcomes, verdict, per_lr",
    [
        (
            {0.3: ["holds", "holds"], 1.0: ["holds", "holds"], 3.0: ["holds", "holds"]},
            "holds",
            "x0.3 holds, x1 holds, x3 holds",
        ),
        # holds at two learning rates, undecided at the third: the intersection does not hold
        (
            {0.3: ["holds", "inconclusive"], 1.0: ["holds", "holds"], 3.0: ["holds", "holds"]},
            "inconclusive",
            "x0.3 inconclusive, x1 holds, x3 holds",
        ),
        # one reversal at one learning rate contradicts the claim over the range
        (
            {0.3: ["holds", "holds"], 1.0: ["holds", "holds"], 3.0: ["holds", "contradicted"]},
            "contradicted",
            "x0.3 holds, x1 holds, x3 contradicted",
        ),
        (
            {0.3: ["holds", "absent"], 1.0: ["holds", "holds"], 3.0: ["inconclusive", "holds"]},
            "absent",
            "x0.3 absent, x1 holds, x3 inconclusive",
        ),
    ],
)
def test_a_claim_holds_only_if_it_holds_at_every_learning_rate(outcomes, verdict, per_lr):
    from calibrl.toy import verdicts as V

    comp = pd.concat([_comp(outcomes, claim) for claim in V.CLAIMS], ignore_index=True)
    summary = V.verdicts(comp)
    assert (summary["verdict"] == verdict).all() and (summary["per_lr"] == per_lr).all()
    rows = V.claims_rows(comp, "over lr x{0.3, 1, 3}")
    assert (rows["verdict"] == verdict).all()
    assert (rows["note"] == f"over lr x{{0.3, 1, 3}}; per lr: {per_lr}").all()
    if verdict == "contradicted":  # the row names the reversed comparison and its learning rate
        assert rows["claim"].str.endswith("(lr x3)").all() and (rows["estimate"] < 0).all()


# ------------------------------------------------------------------------------------ the simulation itself
def test_settings_simulated_together_are_the_same_as_alone():
    from dataclasses import replace

    from calibrl.toy.sim import simulate

    base = toy(group_size=4, steps=40, seeds=8, record_every=20)
    settings = [
        replace(base, estimator="norm", optimizer="adamw", lr=0.05, siamese="low"),
        replace(base, estimator="raw", optimizer="momentum", lr=0.2, iac_alpha=1.0, dlc_mu=0.5),
        replace(base, estimator="rpp", lr=1.0, init="random"),
    ]
    together = simulate(settings)
    for setting, frame in zip(settings, together):
        pd.testing.assert_frame_equal(frame, run(setting))
    with pytest.raises(ValueError, match="share"):
        simulate([base, replace(base, group_size=8)])


def test_explicit_gradients_match_autograd_of_the_shared_losses():
    import torch

    from calibrl.algo.dlc import memory_loss
    from calibrl.toy.sim import memory_grad, policy_grad

    gen = torch.Generator().manual_seed(0)
    e_q = torch.tensor([0.75, 0.5, 0.25, 0.1], dtype=torch.float64)
    w = torch.randn(5, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    sampled = torch.randint(0, 4, (5, 6), generator=gen)
    adv = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    logp = torch.log_softmax(w @ e_q, dim=-1).gather(-1, sampled)
    (-(adv * logp).mean(dim=-1).sum()).backward()
    pi = torch.softmax(w @ e_q, dim=-1).detach()
    torch.testing.assert_close(policy_grad(pi, sampled, adv, e_q), w.grad)
    m = torch.randn(5, 4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    logits = (m @ e_q).unsqueeze(1).expand(-1, 6, -1)
    (memory_loss(logits.reshape(-1, 4), sampled.reshape(-1)) * 5).backward()  # the mean over G per row
    torch.testing.assert_close(memory_grad((m @ e_q).detach(), sampled, e_q), m.grad)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adamw"])
def test_written_out_optimizers_match_torch_optim(optimizer):
    import torch

    from calibrl.toy.sim import _Optimizer

    setting = toy(optimizer=optimizer, lr=0.3, seeds=3)
    gen = torch.Generator().manual_seed(1)
    ours = torch.randn(3, 4, 4, generator=gen, dtype=torch.float64)
    ref = ours.clone().requires_grad_(True)
    opt = _Optimizer([setting], ours)
    if optimizer == "adamw":
        torch_opt = torch.optim.AdamW([ref], lr=0.3, weight_decay=setting.weight_decay)
    else:
        torch_opt = torch.optim.SGD([ref], lr=0.3, momentum=setting.momentum if optimizer == "momentum" else 0.0)
    for step in range(1, 6):
        grad = torch.randn(3, 4, 4, generator=gen, dtype=torch.float64)
        ours = opt.step(ours, grad, step)
        ref.grad = grad.clone()
        torch_opt.step()
    torch.testing.assert_close(ours, ref.detach())
