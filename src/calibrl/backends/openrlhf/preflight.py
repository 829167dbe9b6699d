"""OpenRLHF's own preflight checks (``OpenRLHFGpu.preflight_checks``), run on its training nodes beside the
preflight's common ones (``calibrl.preflight``): its model code with flash-attn's kernel, and DeepSpeed's optimizer
with calibrl's fused-Adam kernel. Each returns what it saw or raises ``CheckFailed`` with the cause and the fix."""

from __future__ import annotations

from calibrl.backends import CheckFailed as Failed


def flash_attn(p: dict) -> str:
    """OpenRLHF 0.11.2 imports flash-attn at module level (models/ring_attn_utils.py) and trains packed sequences
    through ``flash_attn_varlen_func``: its model code must import, and one varlen forward and backward must run on
    the GPU (bf16, two packed sequences, grouped KV heads as Qwen3) and match PyTorch's attention. A wheel built for
    another GPU architecture or CUDA imports fine and fails here."""
    try:
        import flash_attn as fa
        import flash_attn.bert_padding  # noqa: F401
        import openrlhf.models  # noqa: F401
        from flash_attn import flash_attn_varlen_func
    except Exception as exc:
        raise Failed(
            f"OpenRLHF's model code does not import: {type(exc).__name__}: {exc}",
            "build the flash-attn wheel once on a GPU node (sbatch scripts/build_flash_attn.sh), then "
            "scripts/cluster_env.sh build",
        ) from exc
    import torch

    if not torch.cuda.is_available():
        raise Failed(
            f"flash-attn {fa.__version__} and openrlhf.models import, but torch sees no CUDA device: flash-attn's "
            f"kernels run only on NVIDIA GPUs, so its forward was not run",
            "run the preflight on a GPU node (the GPU partition); on a CPU test cluster waive it "
            "(grid.preflight.waive: [flash_attn])",
        )
    name, (major, minor) = torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)
    try:
        err = _varlen_attention_error(flash_attn_varlen_func, torch)
    except Exception as exc:
        raise Failed(
            f"flash-attn {fa.__version__}: flash_attn_varlen_func failed on {name} (sm_{major}{minor}): "
            f"{type(exc).__name__}: {str(exc)[:400]}",
            f"rebuild the wheel for this GPU and torch (sbatch scripts/build_flash_attn.sh with "
            f"FLASH_ATTN_CUDA_ARCHS including {major}{minor}; remove the old wheel from .wheels/ first)",
        ) from exc
    if err > 0.05:
        raise Failed(
            f"flash-attn {fa.__version__} on {name}: the varlen attention differs from PyTorch's by {err:.3f} (bf16)",
            "rebuild the flash-attn wheel against the venv's torch (sbatch scripts/build_flash_attn.sh)",
        )
    return (
        f"flash-attn {fa.__version__}: varlen forward + backward on {name} (bf16, 2 packed sequences) matches "
        f"PyTorch within {err:.1e}; openrlhf.models imports"
    )


def _varlen_attention_error(varlen, torch) -> float:
    """The largest difference between ``varlen`` (flash-attn's packed, causal attention) and PyTorch's attention on
    the same two sequences of 5 and 3 tokens (4 query heads, 2 KV heads of size 128), forward and gradient."""
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths, heads, kv_heads, dim = [5, 3], 4, 2, 128
    total = sum(lengths)

    def rand(h):
        x = torch.randn(total, h, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        return x.requires_grad_(True)

    q, k, v = rand(heads), rand(kv_heads), rand(kv_heads)
    cu = torch.tensor([0, lengths[0], total], device="cuda", dtype=torch.int32)
    out = varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    out.float().square().sum().backward()
    grads = [t.grad.float() for t in (q, k, v)]
    q2, k2, v2 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    parts = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q2, k2, v2))  # heads first
        ks, vs = (t.repeat_interleave(heads // kv_heads, dim=0) for t in (ks, vs))
        parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
    ref = torch.cat(parts)
    ref.square().sum().backward()
    torch.cuda.synchronize()
    with torch.no_grad():
        diffs = [(out.float() - ref).abs().max()]
        diffs += [(g - r.grad).abs().max() / r.grad.abs().max().clamp_min(1e-6) for g, r in zip(grads, (q2, k2, v2))]
        return float(max(diffs))


def optimizer(p: dict) -> str:
    """DeepSpeed's FusedAdam, as OpenRLHF's actors build it, constructs and steps with no compiler."""
    import torch

    from calibrl.backends.openrlhf import fused_adam

    try:
        return fused_adam.check("cuda" if torch.cuda.is_available() else "cpu")
    except Exception as exc:
        raise Failed(f"DeepSpeed's optimizer: {type(exc).__name__}: {exc}", "see the cause") from exc
