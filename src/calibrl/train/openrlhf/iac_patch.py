"""IAC inside OpenRLHF 0.11.2, and ``apply()``, the Ray ``worker_process_setup_hook`` that installs it.

Where IAC goes. ``RemoteExperienceMaker.compute_advantages_and_returns(self, experiences)``
(``openrlhf/trainer/ppo_utils/experience_maker.py`` L237-340) gathers the rewards into a (P, G) matrix,
subtracts the group baseline of the estimator (L268-278: ``rloo``, ``reinforce_baseline``/``dr_grpo``,
``group_norm``), scatters the group advantages back to the experiences (L280), hands each experience's
advantages to ``compute_reward`` (L284, which clips them to ``--reward.clip_range`` and puts them on the
last response token) and sums them into per-token returns (L312-317); ``reinforce_baseline`` then whitens
the advantages over all tokens of the batch (L324-338). IAC (Algorithm 1 lines 11-18) belongs between
L278 and L280: calibrate the group advantages, then let OpenRLHF spread them over the tokens, and whiten
after IAC.

How. The method is wrapped; ``compute_reward``, looked up as a module global by the method, is replaced
by a pass-through that a context variable can hook. With ``CALIBRL_IAC_ALPHA`` > 0 the wrapper

1. runs the original method on scratch copies of the experiences (rewards and info cloned, the per-token
   tensors cut to one column so the token loops cost nothing), recording the group advantages that reach
   ``compute_reward``: exactly OpenRLHF's, with its length penalties and baselines;
2. regroups them into (P, G) by ``experience.index`` as L250-256 do, and calibrates them with
   ``calibrl.advantages.iac``, the function the toy and the CPU trainer use;
3. runs the original method on the real experiences, swapping each experience's group advantages for the
   calibrated ones as they reach ``compute_reward`` (after checking they are the ones recorded).

Everything after L280 (reward clipping, KL in the reward, returns, whitening) is OpenRLHF's own code, so
``reinforce_baseline`` is whitened after IAC, and a KL in the reward is handled too. With alpha = 0 (or the
variable unset) the original method runs alone, bit for bit. An estimator IAC is not defined for here
(``gae``, ``reinforce``, ``flash_reinforce``) raises.

Loud failure. The patch checks OpenRLHF's shape when the module is imported (class, method, its
``(self, experiences)`` signature, that it calls ``compute_reward`` and names the four estimators) and at
every call (one ``compute_reward`` call per experience with one advantage per sample, the same values in
both passes, ``index`` a permutation of the samples); anything else raises instead of training without
IAC. ``apply()`` is idempotent: the method and ``compute_reward`` carry a marker and are wrapped once.

Lazy. Ray runs the setup hook in every worker process (vLLM engines and DeepSpeed actors too) before any
actor code; importing OpenRLHF's trainer there would import DeepSpeed and vLLM, and with them CUDA, before
Ray has set the worker's visible devices. ``apply()`` therefore only registers an import hook: the patch is
applied when (and in the process where) ``experience_maker`` is imported, i.e. in the ``PPOTrainer`` actor.
This module imports only the standard library; torch and ``calibrl.advantages`` are imported on first use.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import importlib.abc
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType

log = logging.getLogger("calibrl.iac_patch")

MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
CLASS = "RemoteExperienceMaker"
METHOD = "compute_advantages_and_returns"
SUPPORTED = ("group_norm", "rloo", "reinforce_baseline", "dr_grpo")
"""OpenRLHF estimators with a group baseline (calibrl: grpo, rloo, rpp, drgrpo), where IAC is defined."""
ENV_ALPHA = "CALIBRL_IAC_ALPHA"
ENV_MAX_STEPS = "CALIBRL_MAX_STEPS"
MARK = "__calibrl_iac__"

_hook: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("calibrl_compute_reward_hook", default=None)


def apply() -> None:
    """The ``worker_process_setup_hook``: patch OpenRLHF when (if ever) this process imports it.

    IAC always (it is a no-op while ``CALIBRL_IAC_ALPHA`` is 0 or unset); the step limit of
    ``launch.limit_steps`` when ``CALIBRL_MAX_STEPS`` is set; Dr. GRPO's normaliser (``loss_norm``) when
    ``CALIBRL_LOSS_NORM_LEN`` is set; DLC (``openrlhf_dlc``) when ``CALIBRL_DLC_MU`` > 0.
    """
    when_imported(MODULE, patch)
    if os.environ.get(ENV_MAX_STEPS):
        from calibrl.train.openrlhf.launch import limit_steps

        when_imported("openrlhf.trainer.ppo_trainer", limit_steps)
    from calibrl.train.openrlhf import loss_norm, openrlhf_dlc

    if loss_norm.norm_len() > 0:
        when_imported(loss_norm.MODULE, loss_norm.patch)  # Dr. GRPO's constant normaliser
    if openrlhf_dlc.dlc_mu() > 0:
        openrlhf_dlc.apply()  # DLC: composite engines, memory actor, its sync (openrlhf_dlc)


def iac_alpha() -> float:
    """IAC's alpha from ``CALIBRL_IAC_ALPHA`` (unset or empty: 0)."""
    raw = os.environ.get(ENV_ALPHA, "").strip()
    try:
        alpha = float(raw) if raw else 0.0
    except ValueError:
        raise ValueError(f"{ENV_ALPHA}={raw!r} is not a number") from None
    if not alpha >= 0:  # also catches nan
        raise ValueError(f"{ENV_ALPHA} must be >= 0 (Section 3.1), got {raw!r}")
    return alpha


# ------------------------------------------------------------------------------------- import hook
class _PatchAfterExec(importlib.abc.Loader):
    """Runs the module with its own loader, puts that loader back, then calls the callbacks on it."""

    def __init__(self, loader, callbacks: list[Callable[[ModuleType], None]]):
        self._loader, self._callbacks = loader, callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for callback in list(self._callbacks):
            callback(module)

    def __getattr__(self, name: str):  # get_source, is_package, ... of the real loader
        return getattr(self._loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of the watched modules that the other finders find."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        callbacks = self.callbacks.get(fullname)
        if not callbacks:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            raise ImportError(f"calibrl cannot patch {fullname}: its loader {spec.loader!r} has no exec_module")
        spec.loader = _PatchAfterExec(spec.loader, callbacks)
        return spec


_lock = threading.Lock()


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported: now if it is, else right after its import.

    Registering the same callback twice has no effect.
    """
    with _lock:
        hook = next((f for f in sys.meta_path if isinstance(f, _ImportHook)), None)
        if hook is None:
            hook = _ImportHook()
            sys.meta_path.insert(0, hook)
        callbacks = hook.callbacks.setdefault(name, [])
        if callback in callbacks:
            return
        callbacks.append(callback)
        module = sys.modules.get(name)
    if module is not None:
        callback(module)


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


def patch(module: ModuleType) -> None:
    """Wrap ``RemoteExperienceMaker.compute_advantages_and_returns`` of ``module`` (once)."""
    cls = getattr(module, CLASS, None)
    method = getattr(cls, METHOD, None) if cls is not None else None
    if method is None:
        raise RuntimeError(f"{module.__name__}.{CLASS}.{METHOD} is gone: this OpenRLHF cannot take IAC")
    if getattr(method, MARK, False):
        return
    problems = []
    if list(inspect.signature(method).parameters) != ["self", "experiences"]:
        problems.append(f"signature is {inspect.signature(method)}, not (self, experiences)")
    code = getattr(inspect.unwrap(method), "__code__", None)  # under 0.11.2's @torch.no_grad()
    if code is None or "compute_reward" not in code.co_names:
        problems.append("it no longer calls compute_reward")
    elif missing := set(SUPPORTED) - _constants(code):
        problems.append(f"it no longer names the estimators {sorted(missing)}")
    if not callable(getattr(module, "compute_reward", None)):
        problems.append(f"{module.__name__}.compute_reward is gone")
    if problems:
        raise RuntimeError(f"OpenRLHF's {CLASS}.{METHOD} changed shape ({'; '.join(problems)}); IAC is not applied")

    upstream = module.compute_reward
    if not getattr(upstream, MARK, False):

        @functools.wraps(upstream)
        def compute_reward(*args, **kwargs):
            hook = _hook.get()
            return upstream(*args, **kwargs) if hook is None else hook(upstream, args, kwargs)

        setattr(compute_reward, MARK, True)
        module.compute_reward = compute_reward

    wrapped = _wrap(method)
    setattr(wrapped, MARK, True)
    setattr(cls, METHOD, wrapped)
    log.info("IAC patch installed on %s.%s.%s", module.__name__, CLASS, METHOD)


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


def _calibrate(seen: list, experiences: list, group: int, alpha: float) -> list:
    """IAC on the recorded group advantages: (P, G) by ``experience.index`` as L250-256, then back."""
    import torch

    from calibrl.advantages import iac

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
    calibrated = iac(grouped.view(-1, group), alpha).reshape(-1)[index]
    return list(calibrated.split(sizes))


def _wrap(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_advantages_and_returns(self, experiences):
        alpha = iac_alpha()
        if alpha == 0 or not experiences:
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
