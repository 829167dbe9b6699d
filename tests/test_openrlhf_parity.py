"""Numerical parity of ``calibrl.algo`` with OpenRLHF 0.11.2's own implementation of the same formulas.

At paper scale the OpenRLHF command (``calibrl.backends.openrlhf.command``) maps a compiled method onto
OpenRLHF's implementation; the CPU trainer and the toy use ``calibrl.algo``. Each test calls OpenRLHF's REAL
function, imported from the installed ``openrlhf`` package (its GPU-only imports stubbed where missing, as in
``tests/test_openrlhf.py``), on random inputs with fixed seeds, several shapes, padded masks and edge cases, and
compares it with ours. Each test also checks that a perturbed formula would differ on its inputs, so a change of
ours fails it. Line numbers are of OpenRLHF 0.11.2.

Each formula, ours -> OpenRLHF's (the smallest real unit called):

1. GRPO ``advantages(r, "grpo")`` -> ``RemoteExperienceMaker.compute_advantages_and_returns`` with
   ``group_norm`` (trainer/ppo_utils/experience_maker.py L273-274)
2. RLOO ``advantages(r, "rloo")`` -> the same method, ``rloo`` (L268-270)
3. Reinforce++ ``advantages(r, "rpp", weights=lengths)`` -> the same, ``reinforce_baseline`` (L271-272) and its
   whitening over the batch's response tokens (L325-338)
4. Dr. GRPO ``advantages(r, "drgrpo")`` -> the same, ``dr_grpo`` (L271-272)
5-6. ``losses.policy_loss`` (PPO clip, dual clip) -> ``openrlhf.models.loss.PolicyLoss.forward`` (models/loss.py
   L174-259, the formula L185-212)
7-8. ``losses.kl_k1``, ``kl_k3`` -> ``openrlhf.models.utils.compute_approx_kl`` (models/utils.py L69-128)
9-10. ``losses.token_mean``, ``seq_mean_token_mean`` -> ``openrlhf.models.loss.aggregate_loss`` (models/loss.py
   L11-38), over micro-batches with ``openrlhf.utils.loss_utils._optimizer_step_loss_norm`` (L54-77)
11. ``dapo.overlong_penalty`` -> ``length_penalty.apply_length_penalties`` (trainer/ppo_utils/length_penalty.py
   L109-153) -> ``apply_overlong_penalty`` (L16-57)
12. ``dapo.informative_groups`` -> ``SamplesGenerator._generate_vllm`` (trainer/ppo_utils/samples_generator.py
   L140-193, the filter L168-177); ``dlc.importance_weights`` -> ``PolicyLoss.forward`` with ``is_correction``
   token/clip/ratio (models/loss.py L216-247)

The per-sample advantage is read off OpenRLHF's per-token advantages (``compute_reward`` puts the group advantage
on the last response token, ``get_cumulative_returns`` with gamma 1 spreads it over the response); the per-token
policy loss is read by replacing ``openrlhf.models.loss.aggregate_loss`` (looked up at call time) with the identity
for that call, the aggregation being tested on its own.

Differences by design, each pinned by a test with both sources named:

* GRPO's epsilon: ours ``std + 1e-6`` (``advantages.EPS``), OpenRLHF ``std + 1e-9`` (experience_maker.py L274);
  both Bessel-corrected. Relative difference ``(1e-6 - 1e-9) / (std + 1e-6)`` (< 3e-6 for binary G=8 rewards).
* G = 1: OpenRLHF's ``group_norm`` gives NaN (``std`` of one value) and ``rloo`` divides by zero; ours gives 0
  and raises. The grid's G is 8.
* PPO ratio: OpenRLHF clamps the log-ratio to [-20, 20] before ``exp`` (loss.py L187); ours does not. It
  matters only for a negative advantage without dual clip; every method of the grid has a dual clip.
* Clip fraction (a logged metric): ours counts dual-clipped tokens as clipped, OpenRLHF's ``ppo_clip_ratio``
  (loss.py L257) does not.
* KL: OpenRLHF clamps k1 and k3 to [-10, 10] and k3's log-ratio below at -10 (utils.py L108, L113); ours does
  not clamp. k3 exceeds 10 (OpenRLHF: 10, gradient 0) once ``log pi - log pi_ref < -2.61``.
* seq-mean-token-mean: OpenRLHF leaves responses without a token out of the mean and adds 1e-8 to each
  response's token count (loss.py L35-36); ours divides by every response (a count of 0 clamped to 1). vLLM
  generates at least one token (``min_tokens=1``, samples_generator.py L204), so no response is empty. An
  all-masked batch: OpenRLHF's token-mean is NaN (0/0), ours 0.
* Dynamic filter: OpenRLHF keeps a group iff ``lo < mean score < hi`` (samples_generator.py L172-173, the range
  ``(0, 1)`` from the command), ours iff the values are not all equal. Identical on 0/1 scores (the reward file's
  ``scores``); they differ on other scores, pinned.

Checked only by reading (nothing callable on CPU without the model actors): that ``make_experience`` sets the
per-token ``kl`` to zero when ``--algo.kl.use_loss`` is on (experience_maker.py L205-214), so the rewards carry no
KL for any method of the grid; that the actor builds ``PolicyLoss`` from the args as this file does
(trainer/ray/ppo_actor.py L76-86) and aggregates the KL loss as a token mean whatever ``--actor.loss_agg_mode``
(ppo_actor.py L331: ``aggregate_loss``'s default ``token_level_loss=True``; the CPU trainer adds its KL term to
the per-token loss before the method's aggregation: the same for the token-mean methods, not for Dr. GRPO's
``seq-mean-token-sum-norm``, whose KL OpenRLHF keeps a token mean); that DeepSpeed scales each
micro-batch's loss by 1/gas (``_optimizer_step_loss_norm``'s docstring), modelled in the aggregation test.
"""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import openrlhf_stubs
import pytest
import torch
from conftest import filled, paper_settings

from calibrl import grid as G
from calibrl.algo import dapo
from calibrl.algo.advantages import EPS, advantages, whiten
from calibrl.algo.dlc import IMPORTANCE_BOUNDS, importance_weights
from calibrl.algo.losses import KL_ESTIMATORS, aggregate, policy_loss
from calibrl.backends.openrlhf import command
from calibrl.spec import MethodSpec

HAVE_OPENRLHF = importlib.util.find_spec("openrlhf") is not None
pytestmark = pytest.mark.skipif(
    not HAVE_OPENRLHF,
    reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2 peft accelerate pylatexenc)",
)

OPENRLHF_GROUP_NORM_EPS = 1e-9  # experience_maker.py L274: (r - mean) / (std + 1e-9)
OPENRLHF_LOG_RATIO_CLAMP = 20.0  # loss.py L187
OPENRLHF_KL_CLAMP = 10.0  # utils.py L108, L113
K3_AT_CLAMP = -2.6109  # log pi - log pi_ref where k3 = e^-x - 1 + x reaches 10 (x < 0)
PAIRS = {"grpo": "group_norm", "rloo": "rloo", "rpp": "reinforce_baseline", "drgrpo": "dr_grpo"}


# ------------------------------------------------------------------------------- OpenRLHF, CPU stubs
@pytest.fixture(scope="module")
def orl():
    """OpenRLHF 0.11.2's leaf modules holding the formulas (tests/openrlhf_stubs.py: GPU-only imports stubbed where
    they cannot be imported; ``sys.modules`` restored afterwards)."""
    with openrlhf_stubs.stubbed():
        import openrlhf.models.loss as loss
        import openrlhf.models.utils as utils
        import openrlhf.trainer.ppo_utils.experience_maker as em
        import openrlhf.trainer.ppo_utils.length_penalty as lp
        import openrlhf.trainer.ppo_utils.samples_generator as sg
        import openrlhf.utils.loss_utils as lu
        from openrlhf.trainer.ppo_utils.experience import Experience

        yield SimpleNamespace(loss=loss, utils=utils, em=em, lp=lp, sg=sg, lu=lu, Experience=Experience)


def _differs(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-4) -> bool:
    return not torch.allclose(a.double(), b.double(), atol=atol, rtol=0)


# ------------------------------------------------------------------------------------ 1-4 estimators
def _args(estimator: str, group: int, *, max_new: int = 64, overlong: float | None = None) -> SimpleNamespace:
    """The args ``compute_advantages_and_returns`` reads, as the command sets them (clip range opened)."""
    return SimpleNamespace(
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator, gamma=1.0, no_std_norm=False)),
        rollout=SimpleNamespace(n_samples_per_prompt=group, max_new_tokens=max_new),
        reward=SimpleNamespace(
            clip_range=(-1e6, 1e6),
            overlong_buffer_len=overlong,
            overlong_penalty_factor=1.0,
            stop_properly_penalty_coef=None,
        ),
        data=SimpleNamespace(max_len=max_new + 16),
    )


def _experiences(orl, rewards: torch.Tensor, lengths: torch.Tensor, micro: int, seed: int) -> list:
    """The flat samples ``rewards`` (N,) with response lengths ``lengths`` (N,) as OpenRLHF Experiences in shuffled
    micro-batches of ``micro``: a row is prompt (0 in the action mask), response (1), right padding (0) up to the
    micro-batch's longest row plus one; ``index`` maps rows to samples as ``split_rollout_samples`` does. The KL
    is zero (``--algo.kl.use_loss``), float64 so that ``compute_reward`` keeps the rewards' precision."""
    gen = torch.Generator().manual_seed(seed)
    n = rewards.numel()
    order = torch.randperm(n, generator=gen).tolist()
    out = []
    for start in range(0, n, micro):
        idx = order[start : start + micro]
        prompt = torch.randint(0, 4, (len(idx),), generator=gen).tolist()
        width = max(p + int(lengths[i]) for p, i in zip(prompt, idx)) + 1
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, (p, i) in enumerate(zip(prompt, idx)):
            mask[row, p : p + int(lengths[i])] = 1
        r = rewards[idx].clone()
        out.append(
            orl.Experience(
                action_mask=mask,
                rewards=r,
                scores=r.clone(),
                response_length=lengths[idx].clone(),
                kl=torch.zeros(len(idx), width, dtype=torch.float64),
                index=list(idx),
                info={"reward": r.clone()},
            )
        )
    return out


def _maker(orl, args):
    maker = orl.em.RemoteExperienceMaker.__new__(orl.em.RemoteExperienceMaker)
    maker.strategy, maker.args = SimpleNamespace(args=args), args
    maker.advantage_estimator = args.algo.advantage.estimator
    maker.kl_ctl = SimpleNamespace(value=0.0)
    return maker


def _per_sample(experiences, n: int) -> torch.Tensor:
    """(N,) the advantage of each sample, read off OpenRLHF's per-token advantages (one value on every response
    token: gamma 1, no KL in the reward)."""
    out = torch.full((n,), float("nan"), dtype=torch.float64)
    for e in experiences:
        for row, i in enumerate(e.index):
            values = e.advantages[row][e.action_mask[row].bool()]
            same = values[0].expand_as(values)
            assert torch.allclose(values, same, rtol=0, atol=0, equal_nan=True), "one advantage per response"
            out[i] = values[0]
    return out


def openrlhf_advantages(orl, estimator, rewards, lengths, micro=3, seed=0, **kw) -> torch.Tensor:
    """OpenRLHF's advantages of ``rewards`` (P, G) with response ``lengths`` (P, G), shape (P, G)."""
    p, g = rewards.shape
    exps = _experiences(orl, rewards.reshape(-1).double(), lengths.reshape(-1), micro, seed)
    _maker(orl, _args(estimator, g, **kw)).compute_advantages_and_returns(exps)
    return _per_sample(exps, p * g).view(p, g)


def _rewards(p: int, g: int, kind: str, seed: int) -> torch.Tensor:
    """(P, G) rewards: row 0 all correct, row 1 all wrong, row 2 a lone success, the rest random; ``shaped``:
    values with ties from a small set plus continuous ones (DAPO's overlong shaping makes them non-binary)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "binary":
        r = (torch.rand(p, g, generator=gen) < 0.5).double()
    else:
        r = torch.tensor([-1.0, -0.25, 0.0, 0.5, 1.0], dtype=torch.float64)[torch.randint(0, 5, (p, g), generator=gen)]
        r[p // 2 :] += torch.rand(p - p // 2, g, generator=gen, dtype=torch.float64)
    r[0], r[1], r[2] = 1.0, 0.0, 0.0
    r[2, 0] = 1.0
    return r


def _lengths(p: int, g: int, seed: int, high: int = 12) -> torch.Tensor:
    return torch.randint(1, high + 1, (p, g), generator=torch.Generator().manual_seed(seed + 100))


PERTURBED = {  # a nearby formula that must NOT match OpenRLHF on the same inputs
    "grpo": lambda r, w: (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True, correction=0) + EPS),
    "rloo": lambda r, w: r - r.mean(-1, keepdim=True),
    "drgrpo": lambda r, w: advantages(r, "rloo"),
    "rpp": lambda r, w: whiten(r - r.mean(-1, keepdim=True)),  # whitened per response, not per token
}


@pytest.mark.parametrize("ours", list(PAIRS))
@pytest.mark.parametrize("shape", [(6, 8), (7, 4), (5, 2)])
@pytest.mark.parametrize("kind", ["binary", "shaped"])
def test_estimators_match_openrlhf(orl, ours, shape, kind):
    p, g = shape
    seed = 17 * p + g
    rewards, lengths = _rewards(p, g, kind, seed), _lengths(p, g, seed)
    theirs = openrlhf_advantages(orl, PAIRS[ours], rewards, lengths, micro=3 + seed % 4, seed=seed)
    mine = advantages(rewards, ours, weights=lengths if ours == "rpp" else None)
    assert theirs.isfinite().all()
    if ours == "grpo":
        # ours: std + 1e-6 (advantages.EPS); OpenRLHF: std + 1e-9 (experience_maker.py L274); both Bessel
        std = rewards.std(-1, keepdim=True)
        assert torch.allclose(theirs, mine * (std + EPS) / (std + OPENRLHF_GROUP_NORM_EPS), rtol=1e-12, atol=1e-12)
        nonzero = std > 0  # the relative difference is (1e-6 - 1e-9) / (std + 1e-6): < 3e-6 for 0/1 rewards, G <= 8
        assert torch.all((theirs - mine).abs() <= theirs.abs() * EPS / torch.where(nonzero, std, 1.0) + 1e-15)
        if kind == "binary":
            assert torch.allclose(theirs, mine, rtol=3e-6, atol=0)
        assert not torch.equal(theirs[std.squeeze(-1) > 0], mine[std.squeeze(-1) > 0])  # the epsilon shows
    elif ours == "rpp":  # OpenRLHF whitens in float32 (experience_maker.py L326)
        assert torch.allclose(theirs, mine, rtol=1e-5, atol=1e-6)
        whitened = theirs.flatten()
        w = lengths.flatten().double()
        assert (w * whitened).sum() / w.sum() == pytest.approx(0, abs=1e-6)  # token mean 0, token variance 1
        assert (w * whitened**2).sum() / w.sum() == pytest.approx(1, abs=1e-5)
    else:
        assert torch.allclose(theirs, mine, rtol=1e-12, atol=1e-12)
    if ours != "rpp":  # all correct: no signal (Reinforce++: shifted by the batch's mean, the same for all G)
        assert torch.all(theirs[0] == 0)
    assert torch.equal(theirs[0], theirs[0][0].expand(g)) and torch.equal(theirs[1], theirs[1][0].expand(g))
    assert _differs(PERTURBED[ours](rewards, lengths), theirs)


@pytest.mark.parametrize("ours", list(PAIRS))
def test_groups_without_signal_get_zero_advantage_in_both(orl, ours):
    """All groups uniform (zero std everywhere): 0 in both, not NaN (GRPO's epsilon; Reinforce++'s variance floor,
    experience_maker.py L333, ours ``advantages.VAR_FLOOR``)."""
    rewards = torch.tensor([[1.0] * 4, [0.0] * 4, [0.5] * 4], dtype=torch.float64)
    lengths = _lengths(3, 4, 5)
    theirs = openrlhf_advantages(orl, PAIRS[ours], rewards, lengths)
    mine = advantages(rewards, ours, weights=lengths if ours == "rpp" else None)
    assert torch.equal(theirs, torch.zeros_like(theirs)) and torch.equal(mine, torch.zeros_like(mine))


def test_a_group_of_one_is_nan_in_openrlhf_and_zero_or_refused_in_ours(orl):
    """G = 1 differs by design: OpenRLHF's group_norm divides 0 by the NaN std of one value (experience_maker.py
    L274), its rloo by G - 1 = 0 (L269); ours gives 0 (GRPO) and raises (RLOO). The grid's G is 8."""
    rewards, lengths = torch.tensor([[1.0], [0.0], [1.0]], dtype=torch.float64), torch.ones(3, 1, dtype=torch.long)
    with pytest.warns(UserWarning, match="degrees of freedom"):
        assert openrlhf_advantages(orl, "group_norm", rewards, lengths).isnan().all()
    assert torch.equal(advantages(rewards, "grpo"), torch.zeros(3, 1, dtype=torch.float64))
    assert not openrlhf_advantages(orl, "rloo", rewards, lengths).isfinite().any()
    with pytest.raises(ValueError, match="G >= 2"):
        advantages(rewards, "rloo")


# ------------------------------------------------------------------------------------ 11 overlong penalty
@pytest.mark.parametrize(("max_new", "cache"), [(16, 4), (20, 20), (8192, 4096), (100, 1)])
def test_overlong_penalty_matches_openrlhf(orl, max_new, cache):
    start = max_new - cache
    edges = [1, start - 1, start, start + 1, start + cache // 2, max_new - 1, max_new, max_new + 3]
    random = torch.randint(1, max_new + 1, (20,), generator=torch.Generator().manual_seed(max_new + cache))
    lengths = torch.cat([torch.tensor([x for x in edges if x >= 1]), random])
    base = torch.rand(lengths.numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64).round()
    exps = _experiences(orl, base.clone(), lengths, micro=5, seed=cache)
    # the command passes --reward.overlong_buffer_len as an integer string, parsed as float (train_ppo_ray.py L533)
    orl.lp.apply_length_penalties(exps, _args("group_norm", 1, max_new=max_new, overlong=float(cache)))
    theirs = torch.empty_like(base)
    for e in exps:
        theirs[e.index] = e.rewards - base[e.index]
        assert torch.equal(e.info["reward"], e.rewards)
    mine = dapo.overlong_penalty(lengths, max_new, cache).double()
    assert torch.allclose(theirs, mine, rtol=0, atol=1e-7)  # ours in float32 (lengths.float()), theirs in Python floats
    assert theirs.min() == -1 and (theirs == 0).any() == (start >= 1)  # cache = max_new: every response penalized
    # a penalty factor other than the command's 1.0, or the ramp one token off, would not match
    assert _differs(0.5 * mine, theirs, atol=1e-6)
    assert _differs(dapo.overlong_penalty(lengths + 1, max_new, cache).double(), theirs, atol=1e-6)


# ------------------------------------------------------------------------------------ 5-6 policy loss
def _per_token(orl, monkeypatch, loss_fn, logp, old, adv, mask, rollout=None):
    """OpenRLHF's per-token policy loss (its ``aggregate_loss``, looked up at call time, made the identity) and
    its other outputs (clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)."""
    with monkeypatch.context() as m:
        m.setattr(orl.loss, "aggregate_loss", lambda loss, *a, **k: loss)
        return loss_fn(logp, old, adv, action_mask=mask, rollout_log_probs=rollout)


def _policy_inputs(b: int, t: int, seed: int):
    """log-probs with ratios from ~0.1 to ~20 (some exactly 1), per-response advantages with zeros, ties and a
    negative one, a mask with right padding (and one left-padded row)."""
    gen = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(b, t, generator=gen)
    logp = old + 0.8 * torch.randn(b, t, generator=gen)
    logp[:, 0] = old[:, 0]  # ratio exactly 1
    logp[:, -1] = old[:, -1] + 3.0  # ratio 20: beyond dual clip 10 for negative advantages
    adv = torch.randn(b, generator=gen)
    adv[0] = -1.3
    if b > 1:
        adv[-1] = 0.9
    if b > 2:
        adv[1], adv[2] = 0.0, adv[3 % b]  # a zero advantage, a tie
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[0] = t
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    if b > 1:
        mask[-1] = mask[-1].flip(0)
    return logp, old, adv, mask


@pytest.mark.parametrize("shape", [(8, 16), (5, 7), (1, 5)])
@pytest.mark.parametrize("clip", [(0.2, 0.2), (0.2, 0.28)])
@pytest.mark.parametrize("dual", [None, 3.0, 10.0])
def test_ppo_clip_and_dual_clip_match_openrlhf(orl, monkeypatch, shape, clip, dual):
    b, t = shape
    logp, old, adv, mask = _policy_inputs(b, t, seed=b * t + int(100 * clip[1]) + int(dual or 0))
    per_token_adv = b == 5  # OpenRLHF's advantages are per token; ours take (B,) or (B, T)
    adv_theirs = adv[:, None].expand(b, t).clone()
    loss_fn = orl.loss.PolicyLoss(clip_eps_low=clip[0], clip_eps_high=clip[1], dual_clip=dual, token_level_loss=True)

    lp_theirs, lp_mine = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    theirs, clip_ratio, *_ = _per_token(orl, monkeypatch, loss_fn, lp_theirs, old, adv_theirs, mask)
    mine, active = policy_loss(lp_mine, old, adv_theirs if per_token_adv else adv, clip[0], clip[1], dual)
    assert torch.allclose(theirs, mine, rtol=1e-6, atol=1e-6)
    (theirs * mask).sum().backward()
    (mine * mask).sum().backward()
    assert torch.allclose(lp_theirs.grad, lp_mine.grad, rtol=1e-6, atol=1e-6)

    # the scalar OpenRLHF's actor takes: its token mean (aggregate_loss, token_level_loss=True) of the same tokens
    scalar = loss_fn(logp, old, adv_theirs, action_mask=mask)[0]
    assert scalar.item() == pytest.approx(aggregate(mine, mask, "token-mean", t).item(), rel=1e-6, abs=1e-7)

    # the clip fraction: OpenRLHF's ppo_clip_ratio (loss.py L257) is ours without the dual clip's tokens
    _, plain_active = policy_loss(logp, old, adv, clip[0], clip[1], None)
    assert clip_ratio.item() == pytest.approx(((plain_active * mask).sum() / mask.sum()).item(), abs=1e-7)
    dual_only = (active - plain_active) * mask
    if dual is not None:
        assert dual_only.sum() > 0  # ours counts dual-clipped tokens; OpenRLHF's metric does not

    # a change of ours would show: no clip at all, a symmetric clip where it is asymmetric, no dual clip
    assert _differs(-adv_theirs * torch.exp(logp - old), theirs)
    if clip[0] != clip[1] and b > 1:  # (b = 1: one negative advantage, which clip_high does not bound)
        assert _differs(policy_loss(logp, old, adv, clip[0], clip[0], dual)[0], theirs, atol=1e-5)
    if dual is not None:
        assert _differs(policy_loss(logp, old, adv, clip[0], clip[1], None)[0], theirs)


def test_ppo_ratio_beyond_exp20_differs_only_without_dual_clip(orl, monkeypatch):
    """OpenRLHF clamps the log-ratio to [-20, 20] (loss.py L187), ours does not: for a negative advantage without
    dual clip the losses differ (-A e^20 against -A e^25); with a dual clip (every method of the grid) both are
    -A * dual_clip, and for a positive advantage both are clipped to -A (1 + eps)."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[25.0, 1.0, -25.0], [25.0, 1.0, -25.0]])
    adv = torch.tensor([-1.0, 2.0])
    adv_tok = adv[:, None].expand(2, 3).clone()
    mask = torch.ones(2, 3)
    theirs, *_ = _per_token(orl, monkeypatch, orl.loss.PolicyLoss(0.2, 0.2, None), logp, old, adv_tok, mask)
    mine, _ = policy_loss(logp, old, adv, 0.2, 0.2, None)
    assert theirs[0, 0].item() == pytest.approx(math.exp(OPENRLHF_LOG_RATIO_CLAMP), rel=1e-6)
    assert mine[0, 0].item() == pytest.approx(math.exp(25.0), rel=1e-6)
    assert torch.allclose(theirs[:, 1:], mine[:, 1:]) and torch.allclose(theirs[1], mine[1])
    theirs, *_ = _per_token(orl, monkeypatch, orl.loss.PolicyLoss(0.2, 0.2, 3.0), logp, old, adv_tok, mask)
    mine, _ = policy_loss(logp, old, adv, 0.2, 0.2, 3.0)
    assert torch.allclose(theirs, mine, rtol=1e-6, atol=1e-8) and theirs[0, 0] == 3.0


# ------------------------------------------------------------------------------------ 7-8 KL
@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("shape", [(3, 5), (16, 33)])
def test_kl_estimators_match_openrlhf(orl, estimator, shape):
    gen = torch.Generator().manual_seed(shape[1])
    ref = -4 * torch.rand(shape, generator=gen)
    logp = ref + (torch.rand(shape, generator=gen) * 5.0 - 2.5)  # log-ratio in [-2.5, 2.5]: inside the clamps
    logp[0, 0] = ref[0, 0]  # equal: 0 in both
    old = logp + 0.1 * torch.randn(shape, generator=gen)
    lp_theirs, lp_mine = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    # as the actor calls it for the KL loss (ppo_actor.py L320-326; unbiased_gradient off by default)
    theirs = orl.utils.compute_approx_kl(lp_theirs, ref, log_probs_old=old, kl_estimator=estimator)
    mine = KL_ESTIMATORS[estimator](lp_mine, ref)
    assert torch.allclose(theirs, mine, rtol=1e-6, atol=1e-6) and theirs[0, 0] == 0 == mine[0, 0]
    theirs.sum().backward()
    mine.sum().backward()
    assert torch.allclose(lp_theirs.grad, lp_mine.grad, rtol=1e-6, atol=1e-6)
    other = "k3" if estimator == "k1" else "k1"
    assert _differs(KL_ESTIMATORS[other](logp, ref), theirs)
    assert _differs(KL_ESTIMATORS[estimator](ref, logp), theirs)  # the direction of the ratio


def test_kl_clamps_are_openrlhfs_alone(orl):
    """OpenRLHF clamps k1 and k3 to [-10, 10] (utils.py L113) and k3's log-ratio below at -10 (L108); ours does
    not. Beyond the clamp OpenRLHF's value is 10 and its gradient 0. k3 reaches 10 at a log-ratio of -2.61 (the
    policy at 7% of the reference's probability), k1 at +-10."""
    x = torch.tensor([-12.0, -10.5, K3_AT_CLAMP - 0.01, K3_AT_CLAMP + 0.01, 0.0, 9.9, 10.5, 12.0])
    ref = torch.zeros_like(x)
    for estimator in ("k1", "k3"):
        logp = x.clone().requires_grad_()
        theirs = orl.utils.compute_approx_kl(logp, ref, kl_estimator=estimator)
        theirs.sum().backward()
        mine = KL_ESTIMATORS[estimator](x, ref)
        inside = mine.abs() <= OPENRLHF_KL_CLAMP
        assert torch.allclose(theirs[inside], mine[inside], rtol=1e-6)
        assert torch.equal(theirs[~inside], mine[~inside].clamp(-OPENRLHF_KL_CLAMP, OPENRLHF_KL_CLAMP))
        assert torch.all(logp.grad[~inside] == 0) and (~inside).any()
        expected_outside = {"k1": [0, 1, 6, 7], "k3": [0, 1, 2, 7]}[estimator]
        assert (~inside).nonzero().flatten().tolist() == expected_outside


# ------------------------------------------------------------------------------------ 9-10 aggregation
def _micro_losses(seed: int, rows: list[int], empty_row: bool = False):
    """Micro-batches of per-token losses and masks, each padded to its own longest response."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, b in enumerate(rows):
        lengths = torch.randint(1, 12, (b,), generator=gen)
        t = int(lengths.max()) + int(torch.randint(0, 3, (1,), generator=gen))
        mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
        if empty_row and k == 0:
            mask[0] = 0
        out.append((torch.randn(b, t, generator=gen), mask))
    return out


def _concat(micro):
    t = max(loss.shape[1] for loss, _ in micro)
    pad = [(torch.nn.functional.pad(loss, (0, t - loss.shape[1])), torch.nn.functional.pad(m, (0, t - m.shape[1])))
           for loss, m in micro]  # fmt: skip
    return torch.cat([p[0] for p in pad]), torch.cat([p[1] for p in pad]), t


def openrlhf_step_loss(orl, micro, token_level: bool, dynamic_batch: bool = False) -> torch.Tensor:
    """The loss of one optimizer step of OpenRLHF's actor (one data-parallel rank), accumulated over its
    micro-batches. Fixed micro-batches: each aggregated with the step's totals over gas
    (``_optimizer_step_loss_norm``) and scaled by DeepSpeed's 1/gas. ``dynamic_batch`` (the paper layouts'
    ``--train.dynamic_batch_enable``): DeepSpeed's gas is 1 (utils/deepspeed/deepspeed.py L451-453), so no
    scaling, and the totals are the step's undivided token and non-empty response counts (replay_buffer.py
    L148-177, read; computed here by the same function with gas 1)."""
    gas = 1 if dynamic_batch else len(micro)
    info = orl.lu._optimizer_step_loss_norm([m for _, m in micro], None, 1, gas)
    return sum(orl.loss.aggregate_loss(loss, m, token_level_loss=token_level, **info) / gas for loss, m in micro)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("rows", [[6], [3, 5], [2, 1, 4]])
def test_loss_aggregations_match_openrlhf(orl, mode, rows):
    micro = _micro_losses(len(rows) * 7 + rows[0], rows)
    loss, mask, t = _concat(micro)
    mine = aggregate(loss, mask, mode, t)
    token_level = mode == "token-mean"  # ppo_actor.py L80: token_level_loss = loss_agg_mode == "token-mean"
    theirs = openrlhf_step_loss(orl, micro, token_level)
    assert theirs.item() == pytest.approx(mine.item(), rel=1e-6, abs=1e-7)
    dynamic = openrlhf_step_loss(orl, micro, token_level, dynamic_batch=True)
    assert dynamic.item() == pytest.approx(mine.item(), rel=1e-6, abs=1e-7)
    if len(rows) == 1:  # one micro-batch, no step totals: masked_mean (loss.py L31, L38)
        alone = orl.loss.aggregate_loss(loss, mask, token_level_loss=token_level)
        assert alone.item() == pytest.approx(mine.item(), rel=1e-6, abs=1e-7)
    other = "seq-mean-token-mean" if token_level else "token-mean"
    assert _differs(aggregate(loss, mask, other, t), theirs, atol=1e-5)
    if len(rows) > 1:  # the mean of the micro-batches' means is another formula: the step totals matter
        per_micro = sum(aggregate(x, m, mode, t) for x, m in micro) / len(micro)
        assert _differs(per_micro, theirs, atol=1e-5)


def test_empty_responses_and_empty_batches_differ_by_design(orl):
    """seq-mean-token-mean with a response without tokens: OpenRLHF leaves it out of the mean (loss.py L36),
    ours counts it (B in the denominator), so ours is theirs * (B - 1) / B. An all-masked batch: OpenRLHF's
    token-mean is 0/0 = NaN (masked_mean, utils.py L199-202), ours 0. vLLM generates at least one token."""
    micro = _micro_losses(3, [5], empty_row=True)
    loss, mask, t = _concat(micro)
    theirs = orl.loss.aggregate_loss(loss, mask, token_level_loss=False)
    mine = aggregate(loss, mask, "seq-mean-token-mean", t)
    assert mine.item() == pytest.approx(theirs.item() * 4 / 5, rel=1e-6)
    assert theirs.item() == pytest.approx(openrlhf_step_loss(orl, micro, False).item(), rel=1e-6)
    assert orl.loss.aggregate_loss(loss, mask, token_level_loss=True).item() == pytest.approx(
        aggregate(loss, mask, "token-mean", t).item(), rel=1e-6
    )  # token-mean: an empty row adds nothing to either
    zero = torch.zeros_like(mask)
    assert orl.loss.aggregate_loss(loss, zero, token_level_loss=True).isnan()
    assert aggregate(loss, zero, "token-mean", t) == 0


# ------------------------------------------------------------------------------------ 12a dynamic filter
def openrlhf_kept(orl, monkeypatch, scores: torch.Tensor, value_range=(0.0, 1.0)) -> torch.Tensor:
    """(P,) bool: the groups OpenRLHF's ``SamplesGenerator._generate_vllm`` keeps of ``scores`` (P, G) with dynamic
    filtering on, vLLM and Ray replaced by the G samples of each prompt with those scores."""
    p = scores.shape[0]
    gen = orl.sg.SamplesGenerator.__new__(orl.sg.SamplesGenerator)
    gen.args = SimpleNamespace(algo=SimpleNamespace(dynamic_filtering_range=value_range))
    gen._dispatch_prompts_to_vllm = lambda prompts, labels, images=None, **kw: [
        [(int(label), s) for s in scores[int(label)].tolist()] for label in labels
    ]
    gen._process_response_into_experience = lambda response, **kw: orl.Experience(
        scores=torch.tensor([response[1]]), labels=[str(response[0])], prompts=["q"]
    )
    ray = SimpleNamespace(wait=lambda refs, num_returns, timeout: (refs[:num_returns], refs[num_returns:]))
    ray.get = lambda ref: ref
    monkeypatch.setattr(orl.sg, "ray", ray)
    loader = iter([(None, [f"q{i}"], [str(i)], [None]) for i in range(p)])
    accepted, consumed, exhausted = gen._generate_vllm(loader, num_prompts=p, dynamic_filtering=True)
    assert consumed == p  # every prompt dispatched once (the loader holds no replacements)
    kept = torch.zeros(p, dtype=torch.bool)
    kept[[int(e.labels[0]) for e in accepted]] = True
    assert len(accepted) == int(kept.sum()) * scores.shape[1]  # whole groups kept or dropped
    return kept


@pytest.mark.parametrize("shape", [(12, 8), (9, 4), (6, 2)])
def test_dynamic_filter_matches_openrlhf_on_binary_scores(orl, monkeypatch, shape):
    p, g = shape
    scores = _rewards(p, g, "binary", seed=p * g)  # the reward file's scores: 0/1 correctness
    theirs = openrlhf_kept(orl, monkeypatch, scores)
    mine = dapo.informative_groups(scores)
    assert torch.equal(theirs, mine)
    assert not theirs[0] and not theirs[1] and theirs[2] and theirs.any()  # all correct, all wrong, lone success
    # a filter that kept every group, or only groups with a majority correct, would not match
    assert not torch.equal(theirs, torch.ones(p, dtype=torch.bool))
    assert not torch.equal(theirs, scores.mean(-1) > 0.5)


def test_dynamic_filter_differs_on_non_binary_scores(orl, monkeypatch):
    """OpenRLHF keeps a group iff 0 < mean < 1 (samples_generator.py L172-173 with the command's range 0 1), ours
    iff its values are not all equal: the same on 0/1 scores, not on others (the reward file scores 0/1)."""
    scores = torch.tensor([[0.5, 0.5], [1.0, 2.0], [-1.0, 1.0], [0.0, 1.0]])
    assert openrlhf_kept(orl, monkeypatch, scores).tolist() == [True, False, False, True]
    assert dapo.informative_groups(scores).tolist() == [False, True, True, True]


# ------------------------------------------------------------------------------------ 12b truncated IS
@pytest.mark.parametrize("shape", [(8, 16), (3, 9)])
@pytest.mark.parametrize("dual", [None, 10.0])
def test_truncated_importance_weights_match_openrlhfs_token_clip_correction(orl, monkeypatch, shape, dual):
    b, t = shape
    logp, old, adv, mask = _policy_inputs(b, t, seed=3 * t + int(dual or 0))
    gen = torch.Generator().manual_seed(t)
    log_w = torch.empty(b, t).uniform_(math.log(0.1), math.log(20.0), generator=gen)  # both bounds crossed
    log_w[0, :3] = torch.tensor([math.log(IMPORTANCE_BOUNDS[0]), 0.0, math.log(IMPORTANCE_BOUNDS[1])])
    rollout = old - log_w  # log pi_sample: the rollout engine's log-probs (DLC's composite distribution)
    adv_tok = adv[:, None].expand(b, t).clone()
    low, high = IMPORTANCE_BOUNDS
    # the command's flags: --algo.advantage.is_correction_level token, _mode clip, and the threshold, which is
    # OpenRLHF's default (0.5, 5): left to PolicyLoss's own default here, so that a change of our bounds shows
    loss_fn = orl.loss.PolicyLoss(
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        dual_clip=dual,
        is_correction_level="token",
        is_correction_mode="clip",
        is_correction_gating="ratio",
    )
    assert tuple(loss_fn.is_correction_threshold) == IMPORTANCE_BOUNDS
    lp_theirs, lp_mine = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    theirs, _, _, vllm_kl, filtered = _per_token(orl, monkeypatch, loss_fn, lp_theirs, old, adv_tok, mask, rollout)
    weights = importance_weights(old, rollout, "truncated")
    mine = policy_loss(lp_mine, old, adv, 0.2, 0.28, dual)[0] * weights
    assert torch.allclose(theirs, mine, rtol=1e-6, atol=1e-6)
    (theirs * mask).sum().backward()
    (mine * mask).sum().backward()
    assert torch.allclose(lp_theirs.grad, lp_mine.grad, rtol=1e-6, atol=1e-6)

    # the weight itself, where the loss is not 0: OpenRLHF's corrected over uncorrected loss
    plain, *_ = _per_token(orl, monkeypatch, orl.loss.PolicyLoss(0.2, 0.28, dual), logp, old, adv_tok, mask)
    nz = plain.abs() > 1e-3
    assert torch.allclose((theirs.detach() / plain)[nz], weights[nz], rtol=1e-5)
    assert weights.min() == low and weights.max() == high
    outside = ((old - rollout).exp() < low) | ((old - rollout).exp() > high)
    assert filtered.item() == pytest.approx(((outside.float() * mask).sum() / mask.sum()).item(), abs=1e-6)
    # not truncated, or the ratio the other way up, would not match; "none" is OpenRLHF with the correction off
    assert _differs(policy_loss(logp, old, adv, 0.2, 0.28, dual)[0] * (old - rollout).exp(), theirs)
    assert _differs(policy_loss(logp, old, adv, 0.2, 0.28, dual)[0] * (rollout - old).exp().clamp(low, high), theirs)
    assert torch.equal(importance_weights(old, rollout, "none"), torch.ones_like(old))


# ------------------------------------------------------------------------------------ the command's mapping
PAPER = filled("paper")


def _parsed(config: dict, run: G.Run, tmp: Path) -> tuple[dict, SimpleNamespace]:
    """(settings.json, OpenRLHF's parsed args) of ``run`` as the launcher builds and checks its command."""
    stamp = json.loads(paper_settings(config, run, tmp).read_text())
    argv = command.build_command(stamp, tmp / "run", tmp / "prompts.jsonl", 40315)
    return stamp, command.check_openrlhf_argv(argv)


@pytest.mark.parametrize("method", ["grpo", "rloo", "rpp", "drgrpo", "dapo", "dapo_iac_dlc"])
def test_the_commands_arguments_make_openrlhf_compute_our_formulas(orl, monkeypatch, tmp_path, method):
    """Each paper method's real command line, parsed by OpenRLHF's own parser, set into OpenRLHF's functions as
    its actor and experience maker set them, computes what ``calibrl.algo`` computes for the compiled method
    (IAC left out: ``tests/test_openrlhf.py`` checks its patch; DLC with the truncated importance weights)."""
    config = copy.deepcopy(PAPER)
    config["grid"]["train"]["dlc_importance"] = "truncated"
    stamp, args = _parsed(config, G.Run("qwen3-8b", method, 0), tmp_path)
    spec, train = MethodSpec.from_dict(stamp["settings"]["method"]), stamp["settings"]["train"]
    group, max_new = int(train["group_size"]), int(train["max_new_tokens"])
    assert args.rollout.n_samples_per_prompt == group and args.rollout.max_new_tokens == max_new

    # 1-4, 11: advantages of a batch. OpenRLHF's rewards are the reward file's: the method's outcome reward of the
    # correctness (DAPO: +1 / -1), to which OpenRLHF adds the overlong penalty (DAPO: lengths into the buffer)
    # before the baseline; ours the trainers' dapo.reward
    p = 5
    correct = _rewards(p, group, "binary", seed=len(method)).bool()
    if spec.overlong_cache is not None:
        lo = max_new - spec.overlong_cache - 64
        lengths = torch.randint(lo, max_new + 1, (p, group), generator=torch.Generator().manual_seed(2))
        lengths[2] = max_new - spec.overlong_cache // 2  # the lone success of row 2 inside the buffer
    else:
        lengths = _lengths(p, group, seed=3, high=40)
    outcome = dapo.outcome_reward(correct, spec.reward).double()
    exps = _experiences(orl, outcome.reshape(-1), lengths.reshape(-1), micro=args.rollout.micro_batch_size, seed=1)
    maker = _maker(orl, args)
    maker.kl_ctl = SimpleNamespace(value=args.algo.kl.init_coef)  # the KL is 0 in the rewards with use_loss
    theirs = _per_sample(maker.compute_advantages_and_returns(exps), p * group).view(p, group)
    shaped = dapo.reward(correct, lengths, spec.reward, max_new, spec.overlong_cache).double()
    if spec.overlong_cache is not None:
        assert _differs(shaped, outcome)
    mine = advantages(shaped, spec.estimator, weights=lengths if spec.estimator == "rpp" else None)
    assert torch.allclose(theirs, mine, rtol=1e-5, atol=1e-6)

    # 5-6, 12b: the policy loss as ppo_actor.py L76-86 builds it
    b, t = 6, 11
    logp, old, adv, mask = _policy_inputs(b, t, seed=7)
    rollout = old - torch.empty(b, t).uniform_(-2.5, 2.5, generator=torch.Generator().manual_seed(8))
    loss_fn = orl.loss.PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )
    adv_tok = adv[:, None].expand(b, t).clone()
    per_token, *_ = _per_token(orl, monkeypatch, loss_fn, logp, old, adv_tok, mask, rollout)
    mine = policy_loss(logp, old, adv, spec.clip_low, spec.clip_high, spec.dual_clip)[0]
    mine = mine * importance_weights(old, rollout, spec.dlc_importance or "none")
    assert torch.allclose(per_token, mine, rtol=1e-6, atol=1e-6)
    if spec.uses_dlc:
        assert _differs(per_token, policy_loss(logp, old, adv, spec.clip_low, spec.clip_high, spec.dual_clip)[0])

    # 9-10: the aggregation (Dr. GRPO's constant normaliser is loss_norm's patch of token-mean)
    scalar = loss_fn(logp, old, adv_tok, action_mask=mask, rollout_log_probs=rollout)[0]
    if spec.loss_agg == "seq-mean-token-sum-norm":
        assert args.actor.loss_agg_mode == "token-mean"
    else:
        assert scalar.item() == pytest.approx(aggregate(mine, mask, spec.loss_agg, t).item(), rel=1e-6, abs=1e-7)

    # 7-8: the KL loss term (its coefficient and estimator), 0 for DAPO
    assert args.algo.kl.init_coef == spec.kl_coef and bool(args.algo.kl.use_loss) == spec.uses_kl
    if spec.uses_kl:
        ref = logp - torch.empty(b, t).uniform_(-2.5, 2.5, generator=torch.Generator().manual_seed(9))
        kl = orl.utils.compute_approx_kl(logp, ref, log_probs_old=old, kl_estimator=args.algo.kl.estimator)
        assert torch.allclose(kl, KL_ESTIMATORS[spec.kl_estimator](logp, ref), rtol=1e-6, atol=1e-6)

    # 12a: the dynamic filter with the command's range
    assert bool(args.algo.dynamic_filtering_enable) == spec.dynamic_sampling
    if spec.dynamic_sampling:
        # the reward file's scores, the 0/1 correctness, whatever the reward's scale
        kept = openrlhf_kept(orl, monkeypatch, correct.float(), tuple(args.algo.dynamic_filtering_range))
        assert torch.equal(kept, dapo.informative_groups(correct.float()))


# ------------------------------------------------------------------------- PPO mini-batches: the clip binds
@pytest.mark.parametrize("k", [1, 4])
def test_the_clip_fraction_over_ppo_minibatches_matches_openrlhf(orl, tmp_path, k):
    """One DAPO step of the CPU trainer (``Trainer._update``: ``ppo_minibatches`` AdamW updates on whole groups in
    order) against the same updates taken as OpenRLHF takes them with ``--train.batch_size`` B x G / k
    (``command.train_samples``; with dynamic batches the replay buffer is split in order, ``ppo_actor.ppo_train``):
    its real ``PolicyLoss`` on each mini-batch, the same model, advantages and optimizer. Both give the same clip
    fraction (``ppo_clip_ratio``) at every update; it is 0 with one update per step (the ratio is 1) and binds from
    the second of k = 4."""
    from calibrl import config as C
    from calibrl.backends.local import trainer as T
    from calibrl.data import countdown
    from calibrl.models import build_model, build_tokenizer, save
    from calibrl.spec import TrainSettings, compile_method

    train = C.filled(
        "grid.train",
        {
            "steps": 1,
            "eval_every": 1,
            "prompts_per_step": 4,
            "group_size": 4,
            "lr": 3e-2,
            "max_new_tokens": 6,
            "ppo_minibatches": k,
            "dapo_overlong_cache": 4,
        },
    )
    assert command.train_samples(train) == 16 // k
    spec = compile_method("dapo", C.filled("grid.methods.*", {"estimator": "grpo", "dapo": True}), train)
    tok = build_tokenizer()
    save(build_model(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
         tok, tmp_path / "init")  # fmt: skip

    def score(texts, recs):  # one success in every group of 4: every group informative
        return [(i % 4 == 0, None) for i in range(len(texts))]

    torch.manual_seed(0)
    records = countdown.generate("train", 16, seed=0)
    trainer = T.Trainer(spec, TrainSettings.from_config(train), records, tmp_path / "init", tmp_path / "run", score,
                        seed=0, template="{problem}:")  # fmt: skip
    batch, _, _ = trainer._collect()
    policy, optimizer = copy.deepcopy((trainer.policy, trainer.optimizer))  # OpenRLHF's side starts alike
    adv = trainer._advantages(batch)
    roll = batch.rollout
    with torch.no_grad():
        old = T.token_logprobs(policy, roll)
    loss_fn = orl.loss.PolicyLoss(clip_eps_low=spec.clip_low, clip_eps_high=spec.clip_high, dual_clip=spec.dual_clip,
                                  token_level_loss=True)  # fmt: skip
    theirs = []
    per_update = command.train_samples(train)
    for start in range(0, len(adv), per_update):  # the replay buffer in order, B x G / k samples an optimizer step
        rows = torch.arange(start, start + per_update)
        sub, mask = roll.rows(rows), roll.response_mask[rows].float()
        logp = T.token_logprobs(policy, sub)
        loss, clip_ratio, *_ = loss_fn(logp, old[rows], adv[rows, None].expand_as(logp), action_mask=mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), train["grad_clip"])
        optimizer.step()
        theirs.append(clip_ratio.item())

    ours = trainer._update(batch)
    assert ours["updates"] == len(theirs) == k
    assert ours["clip_frac"] == pytest.approx(sum(theirs) / k, abs=1e-6)
    assert theirs[0] == 0.0  # the first update's ratio is 1
    if k == 1:
        assert ours["clip_frac"] == 0.0  # one update per step: the clip never acts
    else:
        assert all(c > 0 for c in theirs[1:]), theirs  # the later updates' ratios leave [1 - 0.2, 1 + 0.28]
