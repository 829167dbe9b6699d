"""The algorithm core against the paper's formulas and the recipes': estimators and IAC (Section 2.4, Section 3.1,
Algorithm 1), the policy loss, KL and aggregation, DAPO's shaping, DLC (Section 3.2), and the registries."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrl.algo import dapo
from calibrl.algo.advantages import ESTIMATORS, advantages, estimator, iac, iac_factor
from calibrl.algo.dlc import calibrated_logits, memory_loss
from calibrl.algo.losses import AGGREGATIONS, KL_ESTIMATORS, aggregate, policy_loss


def get_estimator(name):
    """The whole estimator ``name`` (group baseline, then its batch transform), uncalibrated."""
    return lambda r: advantages(r, name)


binary_groups = st.integers(min_value=2, max_value=16).flatmap(
    lambda g: st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=g, max_size=g), min_size=1, max_size=6)
)


def test_hand_computed_group():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    assert torch.equal(get_estimator("raw")(r), r)
    assert torch.allclose(get_estimator("mean")(r), torch.tensor([[0.5, -0.5, -0.5, 0.5]]))
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    assert torch.allclose(get_estimator("norm")(r), torch.tensor([[0.5, -0.5, -0.5, 0.5]]) / (std + 1e-6))
    # leave-one-out: 1 - 1/3, 0 - 2/3
    assert torch.allclose(get_estimator("rloo")(r), torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    assert torch.equal(get_estimator("drgrpo")(r), get_estimator("mean")(r))


def test_reinforce_pp_whitens_over_the_batch_not_the_group():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    a = get_estimator("rpp")(r)
    centered = r - r.mean(-1, keepdim=True)
    expected = (centered - centered.mean()) / centered.std(correction=0)  # OpenRLHF: no Bessel correction
    assert torch.allclose(a, expected)
    assert abs(float(a.mean())) < 1e-6
    assert float(a.std(correction=0)) == pytest.approx(1.0, abs=1e-5)


def test_leading_axes_are_independent_batches():
    torch.manual_seed(0)
    r = (torch.rand(5, 3, 8) > 0.5).float()
    for name in ESTIMATORS:
        fn = get_estimator(name)
        together = fn(r)
        apart = torch.stack([fn(r[i]) for i in range(5)])
        assert torch.allclose(together, apart, atol=1e-6), name


@settings(max_examples=200, deadline=None)
@given(binary_groups, st.sampled_from(ESTIMATORS.names()))
def test_alpha_zero_is_the_uncalibrated_estimator_exactly(groups, name):
    r = torch.tensor(groups)
    est = ESTIMATORS[name]
    uncalibrated = est.batch(est.group(r)) if est.batch else est.group(r)
    assert torch.equal(advantages(r, name, 0.0), uncalibrated)


@settings(max_examples=200, deadline=None)
@given(binary_groups, st.sampled_from(ESTIMATORS.names()), st.floats(min_value=0.1, max_value=3.0))
def test_iac_scales_positives_by_inverse_success_and_leaves_the_rest(groups, name, alpha):
    r = torch.tensor(groups)
    a = get_estimator(name)(r)
    out = iac(a, alpha)
    g = r.shape[-1]
    for row_a, row_out in zip(a, out):
        n_pos = int((row_a > 0).sum())  # Algorithm 1 line 11: S+ = {s : A_s > 0}
        for x, y in zip(row_a.tolist(), row_out.tolist()):
            if x > 0:
                assert y == pytest.approx(x * (g - n_pos) ** alpha, rel=1e-5)
            else:
                assert y == x


def test_iac_factor_values():
    a = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0]])
    assert float(iac_factor(a, 1.0)[0, 0]) == 6.0
    assert float(iac_factor(a, 2.0)[0, 0]) == 36.0
    all_pos = torch.ones(1, 4)  # raw rewards, all correct: factor 0^alpha
    assert torch.equal(iac(all_pos, 1.0), torch.zeros(1, 4))
    assert torch.equal(iac(all_pos, 0.0), all_pos)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="unknown advantage estimator 'grpoo'"):
        ESTIMATORS["grpoo"]
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        iac(torch.ones(1, 2), -0.5)
    with pytest.raises(ValueError, match="G >= 2"):
        get_estimator("rloo")(torch.ones(1, 1))


def test_all_equal_groups_give_finite_zero_advantages():
    for name in ("mean", "norm", "rloo", "rpp", "drgrpo"):
        a = get_estimator(name)(torch.ones(2, 4))
        assert torch.isfinite(a).all() and torch.equal(a, torch.zeros(2, 4)), name


@settings(max_examples=200, deadline=None)
@given(binary_groups, st.sampled_from(["grpo", "rloo", "drgrpo", "mean", "raw"]))
def test_positive_advantages_are_the_successes_for_binary_rewards(groups, name):
    """S+ = {A > 0} (Algorithm 1 line 11) is Section 3.1's success count in every group with both outcomes."""
    r = torch.tensor(groups)
    a = get_estimator(name)(r)
    for row_r, row_a in zip(r, a):
        if 0 < row_r.sum() < len(row_r) or name == "raw":
            assert torch.equal(row_a > 0, row_r > 0)


@settings(max_examples=100, deadline=None)
@given(binary_groups, st.floats(min_value=0.5, max_value=2.0))
def test_reinforce_pp_calibrates_the_group_advantages_before_whitening(groups, alpha):
    """Reinforce++ with IAC: whiten(IAC(r - mean_G r)), as the OpenRLHF patch orders it (whitening after IAC)."""
    from calibrl.algo.advantages import mean_shifted, whiten

    r = torch.tensor(groups)
    expected = whiten(iac(mean_shifted(r), alpha))
    # S+ is read on the group advantages; whitening afterwards shifts by the calibrated batch's mean
    assert torch.allclose(advantages(r, "rpp", alpha), expected, atol=1e-6)


def test_iac_inside_whitening_differs_from_iac_after_it():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    inside = advantages(r, "rpp", 1.0)
    after = iac(get_estimator("rpp")(r), 1.0)
    assert not torch.allclose(inside, after)


def test_token_weighted_whitening_counts_each_response_as_its_tokens():
    """Reinforce++ whitens over every response token of the batch, as OpenRLHF 0.11.2's reinforce_baseline:
    a response of n tokens counts n times; mean and variance (no Bessel correction) over the tokens."""
    from calibrl.algo.advantages import whiten

    a = torch.tensor([[1.0, -1.0, 0.5, 0.0]])
    w = torch.tensor([[3.0, 1.0, 2.0, 1.0]])
    # by hand: tokens 1, 1, 1, -1, 0.5, 0.5, 0 -> mean 3/7, variance sum((x - 3/7)^2) / 7
    mean = 3 / 7
    var = (3 * (1 - mean) ** 2 + (-1 - mean) ** 2 + 2 * (0.5 - mean) ** 2 + mean**2) / 7
    expected = (a - mean) / math.sqrt(var)
    assert torch.allclose(whiten(a, w), expected)
    assert not torch.allclose(whiten(a, w), whiten(a))  # per response would weigh them equally
    assert torch.allclose(whiten(a, torch.ones_like(a)), whiten(a))
    # OpenRLHF's own arithmetic (experience_maker.py) on the per-token advantages of the batch
    tokens = torch.repeat_interleave(a.flatten(), w.flatten().long())
    var_openrlhf = ((tokens - tokens.mean()) ** 2).mean().clamp(min=1e-8)
    assert torch.allclose(whiten(a, w), (a - tokens.mean()) * var_openrlhf.rsqrt())
    # leading axes are independent batches, each whitened over its own tokens
    both = whiten(torch.stack([a, 2 * a]), torch.stack([w, torch.ones_like(w)]))
    assert torch.allclose(both[0], expected) and torch.allclose(both[1], whiten(2 * a))


def test_a_registered_estimator_is_a_config_value_and_an_unknown_one_is_named():
    from calibrl import config as C

    @estimator("test_median")
    def median_baseline(rewards):
        return rewards - rewards.median(dim=-1, keepdim=True).values

    try:
        assert "test_median" in C.schema()["$defs"]["estimator"]["enum"]
        r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]])
        assert torch.equal(advantages(r, "test_median"), r - 1.0)
        with pytest.raises(ValueError, match="is registered already"):
            estimator("test_median")(lambda r: r)
    finally:
        ESTIMATORS.unregister("test_median")
    assert "test_median" not in C.schema()["$defs"]["estimator"]["enum"]
    assert set(C.schema()["$defs"]["loss_agg"]["enum"]) == set(AGGREGATIONS.names())
    assert set(C.schema()["$defs"]["kl_estimator"]["enum"]) == {"k1", "k3"}


# ------------------------------------------------------------------------------------ the policy loss
def test_loss_pieces_match_their_definitions():
    logp = torch.log(torch.tensor([[0.5, 0.4]]))
    ref = torch.log(torch.tensor([[0.25, 0.4]]))
    k3 = KL_ESTIMATORS["k3"](logp, ref)
    assert k3[0, 0].item() == pytest.approx(0.5 - 1 - torch.log(torch.tensor(0.5)).item(), abs=1e-6)
    assert k3[0, 1].item() == pytest.approx(0.0, abs=1e-7)
    assert torch.equal(KL_ESTIMATORS["k1"](logp, ref), logp - ref)
    loss, clipped = policy_loss(torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.tensor([1.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28) and clipped.item() == 1.0
    per_token = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert aggregate(per_token, mask, "seq-mean-token-mean", 3).item() == pytest.approx(2.0)
    assert aggregate(per_token, mask, "token-mean", 3).item() == pytest.approx(2.0)
    assert aggregate(per_token, mask, "seq-mean-token-sum-norm", 3).item() == pytest.approx((4 / 3 + 2 / 3) / 2)
    assert dapo.overlong_penalty(torch.tensor([2, 3, 4, 6]), 6, 2).tolist() == [0.0, 0.0, 0.0, -1.0]


def test_dual_clip_bounds_the_loss_of_negative_advantages_only():
    """verl's clip_ratio_c / OpenRLHF's dual_clip: for A < 0 the loss is at most -A * c (Ye et al., 2020)."""
    logp, old = torch.log(torch.tensor([[5.0, 5.0, 1.0]])), torch.zeros(1, 3)
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    plain, _ = policy_loss(logp, old, adv, 0.2, 0.2)
    dual, active = policy_loss(logp, old, adv, 0.2, 0.2, dual_clip=3.0)
    assert plain[0, 0].item() == pytest.approx(5.0) and dual[0, 0].item() == pytest.approx(3.0)
    assert dual[0, 1].item() == plain[0, 1].item() and dual[0, 2].item() == plain[0, 2].item()
    assert active[0, 0].item() == 1.0
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        policy_loss(logp, old, adv, 0.2, 0.2, dual_clip=1.0)


def test_dual_clip_is_openrlhfs_policy_loss():
    """OpenRLHF 0.11.2's PolicyLoss with dual_clip (models/loss.py), written out: -where(A < 0, max(min(s1, s2),
    c A), min(s1, s2)); the loss of a negative advantage never exceeds -c A, however large the ratio."""
    torch.manual_seed(0)
    logp, old, adv = torch.randn(6, 5) * 2, torch.randn(6, 5), torch.randn(6, 5)
    ratio = (logp - old).exp()
    s1, s2 = ratio * adv, ratio.clamp(0.8, 1.28) * adv
    expected = -torch.where(adv < 0, torch.maximum(torch.minimum(s1, s2), 3.0 * adv), torch.minimum(s1, s2))
    loss, _ = policy_loss(logp, old, adv, 0.2, 0.28, dual_clip=3.0)
    assert torch.allclose(loss, expected)
    assert (loss[adv < 0] <= -3.0 * adv[adv < 0] + 1e-6).all()


def test_dr_grpo_normaliser_counts_sequences_when_rows_are_not_responses():
    per_token = torch.tensor([[1.0, 3.0, 2.0]])  # two responses packed in one row
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert AGGREGATIONS["seq-mean-token-sum-norm"](per_token, mask, 4, sequences=2).item() == pytest.approx(6 / 8)


def test_dapo_reward_is_verls_signed_reward_plus_the_overlong_penalty():
    """verl's DAPO recipe: math_dapo.compute_score gives +1 correct / -1 wrong, and the DAPO reward manager adds
    min(-(L - (max - buffer)) / buffer * penalty_factor, 0) (max_response_length 8k, overlong_buffer.len 4k,
    penalty_factor 1.0). A correct 7168-token answer: 1 - 0.75 = 0.25, a wrong one -1.75; a correct answer is
    above every wrong one at any length, as in verl (on 1 / 0 the same penalty would put a correct overlong answer
    at or below a short wrong one: twice the recipe's strength)."""
    max_len, buffer = 8192, 4096
    lengths = torch.tensor([1000, 4096, 7168, 8192, 1000, 7168, 8192])
    correct = torch.tensor([True, True, True, True, False, False, False])
    shaped = dapo.reward(correct, lengths, "signed", max_len, buffer)
    assert shaped.tolist() == [1.0, 1.0, 0.25, 0.0, -1.0, -1.75, -2.0]
    verl = [  # verl/workers/reward_manager/dapo.py, written out
        (1.0 if c else -1.0) + min(-(n - (max_len - buffer)) / buffer * 1.0, 0)
        for c, n in zip(correct.tolist(), lengths.tolist())
    ]
    assert shaped.tolist() == pytest.approx(verl)
    assert float(shaped[correct].min()) > float(shaped[~correct].max())
    # the 7k example: 0.29 against -1 for a short wrong answer (verl), not 0.29 against 0
    assert float(dapo.reward(torch.tensor([True]), torch.tensor([7000]), "signed", max_len, buffer)) == (
        pytest.approx(1 - (7000 - 4096) / 4096)
    )
    binary = dapo.reward(correct, lengths, "binary", max_len, buffer)
    assert binary.tolist() == [1.0, 1.0, 0.25, 0.0, 0.0, -0.75, -1.0]  # what the 1 / 0 reward did: 0.0 == 0.0
    assert dapo.reward(correct, lengths, "binary", max_len, None).tolist() == correct.float().tolist()
    assert dapo.outcome_reward(correct, "signed").tolist() == [1.0] * 4 + [-1.0] * 3
    with pytest.raises(ValueError, match="reward must be one of"):
        dapo.outcome_reward(correct, "ternary")


def test_the_compiled_method_says_which_reward_it_trains_on():
    from calibrl import config as C
    from calibrl.spec import compile_method

    train = C.filled("grid.train", {"dapo_overlong_cache": 4096, "max_new_tokens": 8192})
    for switches, kind in (({"dapo": True}, "signed"), ({}, "binary"), ({"iac_alpha": 1.0}, "binary")):
        spec = compile_method("m", C.filled("grid.methods.*", {"estimator": "grpo", **switches}), train)
        assert spec.reward == kind and (spec.overlong_cache is not None) == (kind == "signed")


def test_iac_counts_a_correct_but_penalised_response_as_a_success():
    """DAPO's shaped rewards: a correct answer the overlong penalty put below its group's mean is still a success
    (|S+| counts correctness), and its negative advantage is not amplified; a wrong answer above the mean is not
    scaled."""
    correct = torch.tensor([[True, True, True, False], [True, False, False, False]])
    lengths = torch.tensor([[10, 10, 8192, 10], [8192, 10, 8192, 8192]])
    r = dapo.reward(correct, lengths, "signed", 8192, 4096)
    assert r.tolist() == [[1.0, 1.0, 0.0, -1.0], [0.0, -1.0, -2.0, -2.0]]
    a = ESTIMATORS["grpo"].group(r)
    assert a[0, 2] < 0 and a[1, 1] > 0  # correct below the mean; wrong above it
    alpha = 2.0
    out = iac(a, alpha, correct)
    # group 0: three successes -> (4 - 3)^2 = 1 on the two positive ones; the penalised success stays negative
    assert torch.equal(out[0], a[0])
    assert float(iac_factor(a, alpha, correct)[0, 0]) == 1.0
    # group 1: one success -> (4 - 1)^2 = 9 on it alone; the wrong answer above the mean keeps its advantage
    assert out[1, 0].item() == pytest.approx(a[1, 0].item() * 9) and out[1, 1] == a[1, 1]
    assert torch.equal(out[1, 2:], a[1, 2:])
    # the positive-advantage reading (Algorithm 1 line 11 taken literally) would count 2 and 2, scaling by 4
    literal = iac(a, alpha)
    assert literal[0, 0].item() == pytest.approx(a[0, 0].item() * 4) and literal[1, 1] != a[1, 1]
    # through the estimator, as the trainers call it
    assert torch.equal(advantages(r, "grpo", alpha, successes=correct), out)
    with pytest.raises(ValueError, match="successes of shape"):
        iac(a, alpha, correct[:, :2])


@settings(max_examples=200, deadline=None)
@given(binary_groups, st.sampled_from(ESTIMATORS.names()), st.floats(min_value=0.1, max_value=3.0))
def test_with_binary_rewards_the_success_count_is_the_positive_advantages(groups, name, alpha):
    """Binary rewards and a group baseline: counting correctness or A > 0 gives the same IAC, bit for bit (GRPO,
    IAC and the other non-DAPO runs are unchanged by counting correctness)."""
    r = torch.tensor(groups)
    assert torch.equal(advantages(r, name, alpha, successes=r > 0), advantages(r, name, alpha))


def test_dynamic_sampling_keeps_groups_with_signal():
    values = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0.5, 0.5, 0.5, 0.4]])
    assert dapo.informative_groups(values).tolist() == [False, False, True, True]


# ----------------------------------------------------------------------------------------------- DLC
def test_calibrated_distribution_is_softmax_of_the_difference():
    f_theta = torch.tensor([2.0, 1.0, 0.0, -1.0])
    f_phi = torch.tensor([3.0, 0.0, 0.0, 0.0])
    p = torch.softmax(calibrated_logits(f_theta, f_phi, 0.5), -1)
    expected = torch.exp(f_theta - 0.5 * f_phi)
    assert torch.allclose(p, expected / expected.sum())
    assert torch.equal(calibrated_logits(f_theta, f_phi, 0.0), f_theta)
    with pytest.raises(ValueError, match="mu must be >= 0"):
        calibrated_logits(f_theta, f_phi, -1.0)


def test_memory_training_raises_frequent_outputs_and_pushes_sampling_away():
    mem = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([mem], lr=1.0)
    sampled = torch.tensor([0, 0, 0, 1])  # output 0 generated three times as often
    for _ in range(20):
        loss = memory_loss(mem.expand(4, 4), sampled)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert mem[0] > mem[1] > mem[2]
    f_theta = torch.zeros(4)
    p = torch.softmax(calibrated_logits(f_theta, mem.detach(), 0.5), -1)
    assert p[0] < p[1] < p[2]  # the most generated output is the least likely to be sampled next


def test_memory_loss_summed_in_pieces_is_the_mean_over_all_tokens():
    torch.manual_seed(0)
    logits, targets = torch.randn(10, 7), torch.randint(0, 7, (10,))
    targets[3] = -100  # padding is ignored
    pieces = memory_loss(logits[:4], targets[:4], reduction="sum") + memory_loss(logits[4:], targets[4:], "sum")
    assert torch.allclose(pieces / 9, memory_loss(logits, targets))
