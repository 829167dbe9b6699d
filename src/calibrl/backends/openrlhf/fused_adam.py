"""DeepSpeed's ``FusedAdam`` runs on PyTorch's own Adam kernels: the training jobs compile nothing for the optimizer.

OpenRLHF 0.11.2 gives DeepSpeed an optimizer config (``{"type": "AdamW"}``) and no optimizer, so DeepSpeed 0.19.6
builds ``deepspeed.ops.adam.FusedAdam`` (runtime/engine.py L2196-2203, L2222). The class is kept: ZeRO-3's
``offload_states``, which ``--ds.enable_sleep`` calls, asserts it (runtime/zero/stage3.py L3585). Its kernel is
not. ``FusedAdam.__init__`` takes it from ``FusedAdamBuilder().load()`` (ops/adam/fused_adam.py L94, L97), and
``OpBuilder.load`` returns ``OpBuilder._loaded_ops[name]`` when the entry is there (op_builder/builder.py L143,
L548-549). Without the entry it loads a prebuilt op or JIT-compiles one with nvcc and ninja (L550-564). The
builders of every accelerator share that one dict: ``load`` reads ``__class__._loaded_ops``, which is
``OpBuilder``'s (the CPU builders subclass it too, op_builder/cpu/builder.py L9-14). :func:`install` puts
:data:`OP` there, and its ``multi_tensor_adam`` does what csrc/adam/multi_tensor_adam.cu does.

Like every patch this module imports only the standard library. It runs first thing in every Ray worker
(:mod:`calibrl.gpu.patching`).
"""

from __future__ import annotations

import functools
import logging
import types
from importlib.metadata import PackageNotFoundError, version

from calibrl.gpu.patching import PatchTargetMissing, Target, when_imported

log = logging.getLogger("calibrl.openrlhf.fused_adam")

DEEPSPEED = "0.19.6"
NAME = "fused_adam"  # FusedAdamBuilder.NAME, the key of OpBuilder._loaded_ops


class DeepSpeedTarget(Target):
    """A :class:`Target` in DeepSpeed. If the target is missing, the error names DeepSpeed's versions."""

    def _missing(self, why: str) -> PatchTargetMissing:
        try:
            installed = version("deepspeed")
        except PackageNotFoundError:
            installed = "not installed"
        return PatchTargetMissing(
            f"{self} {why}: calibrl supplies the {NAME} kernel of DeepSpeed {DEEPSPEED} "
            f"(pip install deepspeed=={DEEPSPEED}); the installed DeepSpeed is {installed}"
        )


BUILDER = "deepspeed.ops.op_builder.builder"
LOADED_OPS = DeepSpeedTarget(BUILDER, "OpBuilder._loaded_ops")  # the symbol patched
LOAD = DeepSpeedTarget(BUILDER, "OpBuilder.load", uses="return __class__._loaded_ops[self.name]")
INIT = DeepSpeedTarget("deepspeed.ops.adam.fused_adam", "FusedAdam.__init__", uses="FusedAdamBuilder().load()")
# the op's arguments, as FusedAdam.step passes them through multi_tensor_applier (ops/adam/multi_tensor_apply.py L17)
STEP = DeepSpeedTarget(
    "deepspeed.ops.adam.fused_adam",
    "FusedAdam.step",
    uses="group['eps'], state['step'], self.adam_w_mode, bias_correction, group['weight_decay'])",
)
TARGETS = (LOADED_OPS, LOAD, INIT, STEP)


def multi_tensor_adam(
    chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, eps, step, mode, bias_correction, weight_decay
) -> None:
    """DeepSpeed's op: the signature of csrc/adam/fused_adam_frontend.cpp and the math of multi_tensor_adam.cu.
    ``tensor_lists`` is [grads, params, exp_avgs, exp_avg_sqs], updated in place (the grads are not written).
    ``mode`` 0 adds ``weight_decay * p`` to the gradient (Adam with L2); any other mode decays the parameter
    (AdamW, L97-113). ``bias_correction`` 1 divides by 1 - beta**step, anything else by 1 (L144-148). ``step`` is
    the Python int that FusedAdam counts (fused_adam.py L178-191). The kernel ignores ``noop_flag`` (L46-48).
    ``chunk_size`` only tiles the CUDA launch, so it is ignored here too."""
    import torch

    grads, params, exp_avgs, exp_avg_sqs = tensor_lists
    if not params:
        return
    step = int(step)
    if bias_correction == 1 and params[0].device.type in _fused_devices():
        # torch.optim.Adam(W)'s fused kernels, given the step that torch.optim would have counted by now
        # (torch/optim/adam.py: _fused_adam adds 1 to its step tensors and then calls these).
        fused = torch._fused_adam_ if mode == 0 else torch._fused_adamw_
        steps = [torch.full((), float(step), dtype=torch.float32, device=params[0].device)] * len(params)
        hyper = dict(lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps)
        fused(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, maximize=False, **hyper)
    else:  # no bias correction (torch's kernels always apply it), or a device without torch's fused kernels
        _foreach_adam(
            grads, params, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, step, mode, bias_correction, weight_decay
        )


def _foreach_adam(grads, params, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, step, mode, bias_correction, decay):
    """The kernel's loop (multi_tensor_adam.cu L97-113) as torch._foreach ops. The math is float32, as the kernel's
    is (MATH_T): 16-bit tensors are computed on float32 copies, which are then written back."""
    import torch

    low = params[0].dtype in (torch.float16, torch.bfloat16)
    lists = (grads, params, exp_avgs, exp_avg_sqs)
    g, p, m, v = ([t.float() for t in ts] for ts in lists) if low else lists
    correction1 = 1 - beta1**step if bias_correction == 1 else 1.0
    correction2 = 1 - beta2**step if bias_correction == 1 else 1.0
    if mode == 0 and decay != 0:
        g = torch._foreach_add(g, p, alpha=decay)
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, g, alpha=1 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, value=1 - beta2)
    denom = torch._foreach_div(v, correction2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(m, correction1)
    torch._foreach_div_(update, denom)
    if mode != 0 and decay != 0:
        torch._foreach_add_(update, p, alpha=decay)
    torch._foreach_add_(p, update, alpha=-lr)
    if low:
        for out, new in ((params, p), (exp_avgs, m), (exp_avg_sqs, v)):
            torch._foreach_copy_(out, new)


@functools.cache
def _fused_devices() -> tuple[str, ...]:
    """The device types that have torch's fused Adam kernels (cuda and cpu among them in torch 2.13)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return tuple(_get_fused_kernels_supported_devices())


OP = types.ModuleType("calibrl_fused_adam", "DeepSpeed's fused_adam op on PyTorch's kernels (calibrl)")
OP.multi_tensor_adam = multi_tensor_adam


def install() -> None:
    """Put :data:`OP` in ``OpBuilder._loaded_ops`` in this process, once DeepSpeed's op builder is imported. This
    happens immediately if the builder is imported already. Raises ``PatchTargetMissing`` if the dict is gone."""
    when_imported(BUILDER, put_kernel)


def put_kernel(builder: types.ModuleType) -> None:
    """Make :data:`OP` the ``fused_adam`` op of ``builder`` (``deepspeed.ops.op_builder.builder``). Idempotent.
    An op loaded before (prebuilt or compiled) is replaced, so that every FusedAdam built afterwards computes
    the same thing on every node."""
    ops = LOADED_OPS.resolve(builder)[2]
    if not isinstance(ops, dict):
        raise LOADED_OPS._missing(f"is a {type(ops).__name__}, not a dict")
    previous = ops.get(NAME)
    if previous is OP:
        return
    ops[NAME] = OP
    if previous is not None:
        log.warning("replaced DeepSpeed's %s op %r by PyTorch's kernels", NAME, previous)
    log.info("DeepSpeed's FusedAdam runs on PyTorch's Adam kernels (%s['%s'])", LOADED_OPS, NAME)


class FusedAdamCheckFailed(RuntimeError):
    """DeepSpeed's FusedAdam cannot be built with calibrl's kernel, or does not compute torch's AdamW."""


def check(device: str) -> str:
    """Preflight: build DeepSpeed's FusedAdam (kernel installed) on ``device`` as the engine does for OpenRLHF's
    ``AdamW`` config. Take 3 steps with weight decay and compare them with ``torch.optim.AdamW``. Raises
    :class:`FusedAdamCheckFailed` naming the cause and the fix; returns what it verified, in one line."""
    install()
    import deepspeed
    import torch
    from deepspeed.ops.adam import FusedAdam

    versions = f"DeepSpeed {deepspeed.__version__}, torch {torch.__version__}"
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(257, generator=generator)
    grads = [torch.randn(257, generator=generator) for _ in range(3)]
    try:
        ours = torch.nn.Parameter(start.clone().to(device))
        reference = torch.nn.Parameter(start.clone().to(device))
        optimizer = FusedAdam([ours], adam_w_mode=True, **hyper)
    except Exception as exc:
        raise FusedAdamCheckFailed(
            f"DeepSpeed's FusedAdam cannot be built on {device!r} ({versions}): {exc!r}. "
            f"Cause: the device is not usable here, or DeepSpeed did not take calibrl's kernel from "
            f"{LOADED_OPS} and tried to load or compile its own {NAME} op. Fix: run on a node where {device!r} "
            f"works, with deepspeed=={DEEPSPEED} (calibrl.backends.openrlhf.fused_adam.install must run first)"
        ) from exc
    if optimizer.multi_tensor_adam is not multi_tensor_adam:
        raise FusedAdamCheckFailed(
            f"DeepSpeed's FusedAdam on {device!r} took its kernel from {optimizer.multi_tensor_adam!r}, not from "
            f"calibrl: {LOADED_OPS}['{NAME}'] was replaced after install(). Fix: nothing may load DeepSpeed's "
            f"{NAME} op in this process (install deepspeed=={DEEPSPEED} without DS_BUILD_FUSED_ADAM)"
        )
    torch_adamw = torch.optim.AdamW([reference], foreach=False, fused=False, **hyper)
    for grad in grads:
        ours.grad, reference.grad = grad.clone().to(device), grad.clone().to(device)
        optimizer.step()
        torch_adamw.step()
    diff = (ours.detach() - reference.detach()).abs().max().item()
    if not diff <= 1e-5:  # NaN fails too
        raise FusedAdamCheckFailed(
            f"DeepSpeed's FusedAdam with calibrl's kernel differs from torch.optim.AdamW on {device!r} by "
            f"{diff:.3g} after 3 steps ({versions}). Cause: the installed torch's fused Adam kernels do not "
            f"compute what DeepSpeed's multi_tensor_adam does. Fix: install the pinned torch==2.13.0 and "
            f"deepspeed=={DEEPSPEED}; do not train with this stack"
        )
    path = "torch._fused_adamw_" if torch.device(device).type in _fused_devices() else "torch._foreach ops"
    return (
        f"DeepSpeed {deepspeed.__version__} FusedAdam on {device} runs on {path}, no compiled op: "
        f"3 AdamW steps (weight decay 0.1) match torch.optim.AdamW to {diff:.1e}"
    )
