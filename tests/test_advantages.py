"""The shared estimators and IAC against the paper's formulas (Section 2.4, Section 3.1, Algorithm 1)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrl.advantages import ESTIMATORS, compute_advantages, get_estimator, iac, iac_factor

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
    expected = (centered - centered.mean()) / (centered.std() + 1e-6)
    assert torch.allclose(a, expected)
    assert abs(float(a.mean())) < 1e-6
    assert float(a.std()) == pytest.approx(1.0, abs=1e-4)


def test_leading_axes_are_independent_batches():
    torch.manual_seed(0)
    r = (torch.rand(5, 3, 8) > 0.5).float()
    for name, fn in ESTIMATORS.items():
        together = fn(r)
        apart = torch.stack([fn(r[i]) for i in range(5)])
        assert torch.allclose(together, apart, atol=1e-6), name


@settings(max_examples=200, deadline=None)
@given(binary_groups, st.sampled_from(sorted(ESTIMATORS)))
def test_alpha_zero_is_the_uncalibrated_estimator_exactly(groups, name):
    r = torch.tensor(groups)
    assert torch.equal(compute_advantages(r, name, 0.0), get_estimator(name)(r))


@settings(max_examples=200, deadline=None)
@given(binary_groups, st.sampled_from(sorted(ESTIMATORS)), st.floats(min_value=0.1, max_value=3.0))
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
        get_estimator("grpoo")
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
    from calibrl.advantages import mean_shifted, whiten

    r = torch.tensor(groups)
    expected = whiten(iac(mean_shifted(r), alpha))
    # S+ is read on the group advantages; whitening afterwards shifts by the calibrated batch's mean
    assert torch.allclose(compute_advantages(r, "rpp", alpha), expected, atol=1e-6)


def test_iac_inside_whitening_differs_from_iac_after_it():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    inside = compute_advantages(r, "rpp", 1.0)
    after = iac(get_estimator("rpp")(r), 1.0)
    assert not torch.allclose(inside, after)
