"""Peak GPU memory of one forward+backward of a random-weight Qwen3-8B on the layouts' 9,216-token micro-batch.

    .venv/bin/python benchmarks/gpu_peak_memory.py [--device cuda] [--tokens 9216] [--packed 1,3] [--quick]

The policy's training pass as the layouts run it (``max_tokens_per_gpu: 9216``, ``gradient_checkpointing``),
on one GPU: Qwen3-8B at its real widths (``calibrl.plan.QWEN3``; untied head, vocabulary 151,936), random
weights made directly on the device in bf16 (meta-free: no CPU copy of 8B parameters), sdpa attention,
gradient checkpointing (non-reentrant). The loss is the policy's head work as ``docs/cluster.md`` ("Memory per
GPU") counts it: the bf16 logits of every token upcast to fp32, a log-softmax, the label tokens' log-probs (a
policy-gradient surrogate, their mean) and the entropy logged without gradient (``--no-entropy``: not computed).

Each layout (``--packed``: 1 = one 9,216-token sequence, 3 = three 3,072-token sequences packed in one row with
positions restarting, as OpenRLHF packs) runs twice after a warm-up:

- grads kept: bf16 gradients of all parameters stay allocated (one GPU, no sharding);
- grads dropped: each parameter's gradient is freed as soon as it is accumulated, standing in for ZeRO's
  reduce-scatter that leaves a rank 1/g of them; its peak minus the weights is the activations' peak.

No optimizer state is held (no AdamW step is taken). The printed ZeRO estimates add, per GPU of 8, the model
states the layouts shard: ZeRO-2 bf16 weights whole + (bf16 gradients + fp32 master + Adam moments) / 8,
ZeRO-3 all of it / 8, to the measured activations' peak. ``--quick`` runs a tiny Qwen3 on the CPU (smoke test;
peak resident memory instead of the GPU's counters).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from _common import machine, ratio_line

GIB = 1 << 30
QUICK_SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, inter=192, tied=False)


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen3-8B", help="a calibrl.plan.QWEN3 key (default Qwen/Qwen3-8B)")
    parser.add_argument("--tokens", type=int, default=9216, help="micro-batch tokens (the layouts' max_tokens_per_gpu)")
    parser.add_argument("--packed", default="1,3", help="comma-separated sequences per micro-batch, one layout each")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-entropy", action="store_true", help="skip the logged entropy (one fp32 logits copy less)")
    parser.add_argument("--quick", action="store_true", help="a tiny Qwen3 on the CPU, 256 tokens (smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.tokens = "cpu", 256
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    print(f"machine: {machine()} ({torch.cuda.get_device_name(device) if gpu else 'cpu'}; torch {torch.__version__})")
    model, n, vocab = build(args, device)
    weights = allocated(device, model)
    print(f"{'quick' if args.quick else args.model}: {n / 1e9:.3f} B parameters, bf16 weights {weights / GIB:.2f} GiB "
          f"on {device}; {args.tokens} tokens per micro-batch, gradient checkpointing, sdpa, no optimizer state; "
          f"entropy {'not computed' if args.no_entropy else 'logged (no gradient)'}")  # fmt: skip
    layouts = [int(k) for k in args.packed.split(",")]
    warm = batch(args.tokens, layouts[0], vocab, device)
    step(model, warm, device, True, args.no_entropy)  # warm-up: kernels, allocator
    worst = 0.0
    for k in layouts:
        ids, pos = batch(args.tokens, k, vocab, device)
        for keep in (True, False):
            peak, reserved, secs, after = step(model, (ids, pos), device, keep, args.no_entropy)
            label = "grads kept   " if keep else "grads dropped"
            print(f"{k} x {args.tokens // k} tokens, {label}: peak allocated {peak / GIB:.2f} GiB, peak reserved "
                  f"{reserved / GIB:.2f} GiB, activations' peak (peak - weights) {(peak - weights) / GIB:.2f} GiB, "
                  f"after backward {after / GIB:.2f} GiB; {secs:.2f} s")  # fmt: skip
            if not keep:
                act = peak - weights
                worst = max(worst, act)
                zero2 = weights + 14 * n / 8 + act
                zero3 = 16 * n / 8 + act
                print(f"  per GPU of 8 with AdamW (not run): ZeRO-2 {weights / GIB:.1f} + 14N/8 {14 * n / 8 / GIB:.1f} "
                      f"+ activations {act / GIB:.1f} = {zero2 / GIB:.1f} GiB; ZeRO-3 16N/8 {16 * n / 8 / GIB:.1f} "
                      f"+ activations {act / GIB:.1f} = {zero3 / GIB:.1f} GiB")  # fmt: skip
    detail = f"{worst / GIB:.2f} GiB over {args.tokens} tokens"
    print(ratio_line("activations' peak / bf16 weights", worst / weights, detail))
    return 0


def build(args, device):
    """A random-weight Qwen3 of the model's widths, made on ``device`` in bf16; its parameter count; vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from calibrl.plan import HEAD_DIM, QWEN3, VOCAB

    shape, vocab, head_dim = (QUICK_SHAPE, 4096, 16) if args.quick else (QWEN3[args.model], VOCAB, HEAD_DIM)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["inter"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        head_dim=head_dim, tie_word_embeddings=shape["tied"], max_position_embeddings=max(40960, args.tokens),
        rope_theta=1_000_000, rms_norm_eps=1e-6, use_cache=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    sync(device)
    n = sum(p.numel() for p in model.parameters())
    print(f"built in {time.perf_counter() - t0:.1f} s")
    return model, n, vocab


def batch(tokens: int, k: int, vocab: int, device):
    """``k`` random sequences packed in one row of ``tokens`` tokens, positions restarting at each."""
    import torch

    g = torch.Generator().manual_seed(k)
    ids = torch.randint(0, vocab, (1, tokens), generator=g)
    lengths = [tokens // k + (i < tokens % k) for i in range(k)]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids.to(device), pos.to(device)


def step(model, data, device, keep: bool, no_entropy: bool = False):
    """One forward+backward; (peak allocated, peak reserved, seconds, allocated after backward) in bytes."""
    import torch

    ids, pos = data
    hooks = [] if keep else [p.register_post_accumulate_grad_hook(_drop) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    reset(device)
    t0 = time.perf_counter()
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    del logits
    labels = ids[0, 1:]
    loss = -logp.gather(-1, labels[:, None]).mean()
    with torch.no_grad():  # logged, as the runs log the entropy (Figure 6)
        entropy = logp.new_zeros(()) if no_entropy else -(logp.exp() * logp).sum(-1).mean()
    del logp
    loss.backward()
    float(entropy)
    sync(device)
    secs = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    peak, reserved, after = stats(device)
    model.zero_grad(set_to_none=True)
    return peak, reserved, secs, after


def _drop(param) -> None:
    param.grad = None


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def allocated(device, model) -> int:
    """The device's allocated bytes (the weights, just built); on a CPU the parameters' bytes."""
    import torch

    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def stats(device) -> tuple[int, int, int]:
    """Peak allocated, peak reserved, allocated now; on a CPU the process's peak resident set, three times."""
    import torch

    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device),
                torch.cuda.memory_allocated(device))  # fmt: skip
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return rss, rss, rss


if __name__ == "__main__":
    sys.exit(main())
