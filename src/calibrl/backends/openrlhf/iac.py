"""IAC inside OpenRLHF 0.11.2's advantage computation.

Where IAC goes. ``RemoteExperienceMaker.compute_advantages_and_returns(self, experiences)`` gathers the rewards into
a (P, G) matrix, subtracts the group baseline of the estimator (``rloo``, ``reinforce_baseline``/``dr_grpo``,
``group_norm``), scatters the group advantages back to the experiences, hands each experience's advantages to
``compute_reward`` (which clips them to ``--reward.clip_range`` and puts them on the last response token) and sums
them into per-token returns; ``reinforce_baseline`` then whitens the advantages over all tokens of the batch. IAC
(Algorithm 1 lines 11-18) belongs between the baseline and the scatter: calibrate the group advantages, then let
OpenRLHF spread them over the tokens, and whiten after IAC (``calibrl.algo.advantages.advantages``' order).

How. The method is wrapped; ``compute_reward``, looked up as a module global by the method, is replaced by a
pass-through that a context variable can hook. With alpha > 0 the wrapper

1. runs the original method on scratch copies of the experiences (rewards and info cloned, the per-token tensors
   cut to one column so the token loops cost nothing), recording the group advantages that reach
   ``compute_reward``: exactly OpenRLHF's, with its length penalties and baselines;
2. regroups them into (P, G) by ``experience.index`` and calibrates them with ``calibrl.algo.advantages.iac``, the
   function the toy and the CPU trainer use, counting as successes the samples whose ``experience.scores`` (the
   reward file's 0/1 correctness) are 1, not the rewards: DAPO's are +1 / -1 plus the overlong penalty, and a
   correct but overlong sample can fall below its group's mean;
3. runs the original method on the real experiences, swapping each experience's group advantages for the
   calibrated ones as they reach ``compute_reward`` (after checking they are the ones recorded).

Everything after the scatter (reward clipping, KL in the reward, returns, whitening) is OpenRLHF's own code. With
alpha = 0 the patch is not installed (``hook.patches``). An estimator IAC is not defined for (``gae``,
``reinforce``, ``flash_reinforce``) raises.

Loud failure. Both targets are checked before Ray starts (``patching.Target.check``); when the module is imported
the method's shape is checked too (its ``(self, experiences)`` signature, that it calls ``compute_reward`` and names
the four estimators), and at every call (one ``compute_reward`` call per experience with one advantage per sample,
the same values in both passes, ``index`` a permutation of the samples); anything else raises instead of training
without IAC.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from types import ModuleType

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.iac")

MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
METHOD = Target(MODULE, "RemoteExperienceMaker.compute_advantages_and_returns", params=("self", "experiences"))
COMPUTE_REWARD = Target(MODULE, "compute_reward")
TARGETS = (METHOD, COMPUTE_REWARD)
SUPPORTED = ("group_norm", "rloo", "reinforce_baseline", "dr_grpo")
"""OpenRLHF estimators with a group baseline (calibrl: grpo, rloo, rpp, drgrpo), where IAC is defined."""

_hook: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("calibrl_compute_reward_hook", default=None)


def install(alpha: float) -> None:
    """Calibrate OpenRLHF's group advantages with IAC at ``alpha`` once ``experience_maker`` is imported."""
    if not alpha > 0:
        raise ValueError(f"IAC alpha must be > 0 to be installed (Section 3.1), got {alpha}")
    when_imported(MODULE, functools.partial(patch, alpha=alpha))


# ------------------------------------------------------------------------------------------- patch
def _constants(code) -> set:
    """Every constant in a code object, tuples flattened (``x in [...]`` compiles to a tuple)."""
    out, todo = set(), list(code.co_consts)
    while todo:
        c = todo.pop()
        if isinstance(c, tuple | frozenset):
            todo.extend(c)
        elif isinstance(c, str | int | float):
            out.add(c)
    return out


def patch(module: ModuleType, alpha: float) -> None:
    """Wrap ``compute_advantages_and_returns`` and ``compute_reward`` of ``module`` (once) for IAC at ``alpha``."""
    _, _, method = METHOD.resolve(module)
    COMPUTE_REWARD.resolve(module)
    problems = []
    if list(inspect.signature(method).parameters) != ["self", "experiences"]:
        problems.append(f"signature is {inspect.signature(method)}, not (self, experiences)")
    code = getattr(inspect.unwrap(method), "__code__", None)  # under 0.11.2's @torch.no_grad()
    if code is None or "compute_reward" not in code.co_names:
        problems.append("it no longer calls compute_reward")
    elif missing := set(SUPPORTED) - _constants(code):
        problems.append(f"it no longer names the estimators {sorted(missing)}")
    if problems:
        raise RuntimeError(f"OpenRLHF's {METHOD} changed shape ({'; '.join(problems)}); IAC is not applied")

    def hookable(upstream):
        def compute_reward(*args, **kwargs):
            hook = _hook.get()
            return upstream(*args, **kwargs) if hook is None else hook(upstream, args, kwargs)

        return compute_reward

    COMPUTE_REWARD.wrap(module, "iac", hookable)
    if METHOD.wrap(module, "iac", functools.partial(_wrap, alpha=alpha)):
        log.info("IAC (alpha %g) installed on %s", alpha, METHOD)


@contextlib.contextmanager
def _hooked(fn: Callable) -> Iterator[None]:
    token = _hook.set(fn)
    try:
        yield
    finally:
        _hook.reset(token)


def _first(args: tuple, kwargs: dict):
    """``compute_reward``'s first argument ``r``: the advantages of one experience, one per sample."""
    return args[0] if args else kwargs["r"]


def _with_first(args: tuple, kwargs: dict, value) -> tuple[tuple, dict]:
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "r": value}


def _scratch(experience):
    """A copy the dry run may change: own rewards and info; step tensors cut to one column (cheap loops)."""
    import torch

    c = copy.copy(experience)
    c.rewards = experience.rewards.clone()
    c.info = dict(experience.info)
    for name in ("action_mask", "kl"):
        value = getattr(experience, name)
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            setattr(c, name, value[:, :1].clone())
    c.returns = c.advantages = None
    return c


def _successes(experiences: list):
    """Each sample's correctness (bool tensor), in the experiences' order: its ``scores`` (reward.py's 0/1), never its
    reward."""
    import torch

    missing = [i for i, e in enumerate(experiences) if getattr(e, "scores", None) is None]
    if missing:
        raise RuntimeError(
            f"experiences {missing[:5]} have no scores: IAC counts successes by the reward file's 0/1 correctness "
            "(reward.py's scores), not by the shaped rewards; IAC is not applied"
        )
    scores = torch.cat([e.scores.detach().reshape(-1).float().cpu() for e in experiences])
    if not bool(((scores == 0) | (scores == 1)).all()):
        raise RuntimeError(f"scores must be 0/1 correctness for IAC's success count, got {scores.unique().tolist()}")
    return scores > 0


def _calibrate(seen: list, experiences: list, group: int, alpha: float) -> list:
    """IAC on the recorded group advantages: (P, G) by ``experience.index`` as L250-256, then back; the success
    count from the samples' 0/1 ``scores``."""
    import torch

    from calibrl.algo.advantages import iac

    sizes = [len(e.index) for e in experiences]
    if len(seen) != len(experiences) or any(r.dim() != 1 or len(r) != n for r, n in zip(seen, sizes)):
        raise RuntimeError(
            f"compute_reward got {[tuple(r.shape) for r in seen]} for experiences of {sizes} samples: "
            "OpenRLHF changed how advantages reach the tokens; IAC is not applied"
        )
    index = torch.tensor([i for e in experiences for i in e.index], dtype=torch.long)
    if len(index) % group or not torch.equal(index.sort().values, torch.arange(len(index))):
        raise RuntimeError(f"experience.index is not a permutation of {len(index)} samples in groups of {group}")
    flat = torch.cat(seen)
    grouped = torch.empty_like(flat)
    grouped[index] = flat
    scored = _successes(experiences)
    if len(scored) != len(index):
        raise RuntimeError(f"{len(scored)} scores for {len(index)} samples; IAC is not applied")
    correct = torch.empty(len(index), dtype=torch.bool)
    correct[index] = scored
    successes = correct.view(-1, group).to(grouped.device)
    calibrated = iac(grouped.view(-1, group), alpha, successes).reshape(-1)[index]
    return list(calibrated.split(sizes))


def _wrap(original: Callable, alpha: float) -> Callable:
    def compute_advantages_and_returns(self, experiences):
        if not experiences:
            return original(self, experiences)
        import torch

        args = self.strategy.args
        estimator = args.algo.advantage.estimator
        if estimator not in SUPPORTED or self.advantage_estimator != estimator:
            raise ValueError(f"IAC (alpha={alpha}) needs a group estimator {SUPPORTED}, got {estimator!r}")
        group = int(args.rollout.n_samples_per_prompt)
        if group < 2:
            raise ValueError(f"IAC needs groups: n_samples_per_prompt is {group}")

        # 1. dry run: record the group advantages OpenRLHF computes
        seen: list = []

        def record(upstream, a, kw):
            seen.append(_first(a, kw).detach().clone())
            return upstream(*a, **kw)

        with _hooked(record):
            original(self, [_scratch(e) for e in experiences])

        # 2. calibrate them
        calibrated = _calibrate(seen, experiences, group, alpha)
        low, high = args.reward.clip_range
        top = max(float(c.max()) for c in calibrated)
        if top > high or min(float(c.min()) for c in calibrated) < low:
            log.warning("IAC advantages up to %.3g are clipped to --reward.clip_range %s", top, (low, high))

        # 3. the real run, with the calibrated advantages in place of the recorded ones
        position = 0

        def swap(upstream, a, kw):
            nonlocal position
            r = _first(a, kw)
            if position >= len(seen) or r.shape != seen[position].shape or not torch.equal(r, seen[position]):
                raise RuntimeError("the group advantages differ between the dry and the real run; IAC not applied")
            a, kw = _with_first(a, kw, calibrated[position].to(r.dtype))
            position += 1
            return upstream(*a, **kw)

        with _hooked(swap):
            out = original(self, experiences)
        if position != len(seen):
            raise RuntimeError(f"compute_reward ran {position} times in the real run, {len(seen)} in the dry run")
        for experience, before, after in zip(experiences, seen, calibrated):
            scale = torch.where(before > 0, after / before.where(before > 0, 1.0), torch.ones_like(before))
            experience.info["iac_scale"] = scale  # (G - |S+|)^alpha on positives, 1 elsewhere; logged
        return out

    return compute_advantages_and_returns
