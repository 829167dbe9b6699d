"""The DLC memory's update against the policy's at equal tokens, at the paper's shapes (Qwen3-1.7B / Qwen3-8B).

    .venv/bin/python benchmarks/memory_update_efficiency.py [--repeat 2] [--dtype bfloat16] [--sequences 1] [--quick]
                                                            [--whole]

Both updates run ``memory_actor.MemoryWorker.gradients`` (FSDP2, bf16 compute with fp32 master weights, gradient
checkpointing, the chunked fp32 head loss: the memory's own code, run on the policy's shape too, so the two differ
only in the model) on one sequence of the planner's mean length (``prompt_tokens + response_fraction x
max_new_tokens``: 3,067 tokens, the response's learned). Whole models do not fit this machine (Qwen3-8B's fp32
state alone is 131 GB), so each is timed in parts, at its real widths (``calibrl.plan.QWEN3``) with random
weights:

- a decoder layer: ``t(2 layers) - t(1 layer)``, both with a small vocabulary;
- the head (final norm, vocabulary projection, fp32 log-softmax and loss, the tied embedding):
  ``t(1 layer, 151,936 tokens) - t(1 layer, small vocabulary)``;
- the model: ``layers x layer + head``.

A difference inside the timer's noise (a part that takes milliseconds, on a loaded machine) can come out at zero or
below; the command then stops and names it rather than print a ratio from it. ``--whole`` times each model whole
instead (only for shapes that fit: ``--quick`` implies it, since its parts take milliseconds).

It prints the memory's update time over the policy's and the efficiency (N_m / N_p) / that ratio, N the parameter
counts the planner prices by (``calibrl.plan.parameters``). ``--sequences 1,3,30`` times each count of such
sequences in one gradient pass, packed into micro-batches of at most ``--max-tokens`` (the layouts' 9,216: 3 of
3,067 tokens fill one), as the trainer packs a step's responses; on a GPU one lone sequence leaves it waiting on
per-layer overheads that a full micro-batch amortises. Measured on an H100 (``--device cuda``) it is the
planner's ``memory_update_efficiency``; on a CPU, where memory-bound work weighs far less, it is an upper bound
(``docs/cluster.md``, "DLC at paper scale"). Left out: AdamW's update (per parameter, once per step; at paper scale
each rank's step covers ~300k tokens) and the untied 8B's separate input embedding (a dense gradient, under 1%).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path

from _common import REPO, machine, ratio_line, timed

SMALL_VOCAB = 1024
ROLES = {"memory": "Qwen/Qwen3-1.7B", "policy": "Qwen/Qwen3-8B"}
QUICK = {  # tiny stand-ins for the smoke test: (shape, vocabulary, head_dim)
    "memory": (dict(hidden=64, layers=4, heads=2, kv_heads=1, inter=192, tied=True), 4096, 32),
    "policy": (dict(hidden=128, layers=6, heads=4, kv_heads=2, inter=384, tied=False), 4096, 32),
}


def main(argv=None) -> int:
    import yaml

    from calibrl.plan import ASSUMPTIONS

    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    prompt = int(ASSUMPTIONS["prompt_tokens"][0])
    response = int(ASSUMPTIONS["response_fraction"][0] * paper["grid"]["train"]["max_new_tokens"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=prompt, help="prompt tokens (default: the planner's)")
    parser.add_argument("--response", type=int, default=response, help="response tokens (default: the planner's)")
    parser.add_argument("--repeat", type=int, default=2, help="timed calls per part (best kept), after a warm-up")
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype (the GPUs' bfloat16 by default)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (the figure to replace)")
    parser.add_argument("--sequences", default="1", help="comma-separated sequence counts per gradient pass")
    parser.add_argument("--max-tokens", type=int, default=9216, help="micro-batch tokens (max_tokens_per_gpu)")
    parser.add_argument("--whole", action="store_true", help="time each model whole, not in parts (small shapes)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, whole, 16 + 80 tokens, vocabulary 4,096")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompt, args.response, args.repeat, args.whole = 16, 80, 1, True
    print(f"machine: {machine()} ({args.device}, {args.dtype} compute)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard bars for every model saved and loaded
    with tempfile.TemporaryDirectory() as tmp:
        return run(args, Path(tmp))


def _shape(role: str, quick: bool) -> tuple[dict, int, int]:
    from calibrl.plan import HEAD_DIM, QWEN3, VOCAB

    return QUICK[role] if quick else (QWEN3[ROLES[role]], VOCAB, HEAD_DIM)


def seconds(shape: dict, head_dim: int, layers: int, vocab: int, args, root: Path, batches) -> list[float]:
    """Best time of the memory trainer's gradients on each of ``batches`` ((sequences, learn masks) pairs) for a
    random-weight Qwen3 of ``shape``'s widths."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from calibrl.gpu.memory_actor import MemoryWorker

    config = Qwen3Config(
        vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["inter"], num_hidden_layers=layers,
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"], head_dim=head_dim,
        tie_word_embeddings=True, max_position_embeddings=len(batches[0][0][0]),
    )  # fmt: skip
    path = root / f"{shape['hidden']}x{layers}x{vocab}"
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    gc.collect()
    worker = MemoryWorker(str(path), 1e-6, weight_decay=0.01, decay_scope="all", device=args.device,
                          compute_dtype=args.dtype, max_tokens=args.max_tokens)  # fmt: skip
    best = []
    for seqs, learn in batches:
        ids = [(seq % vocab).long() for seq in seqs]
        worker.gradients(ids, learn)  # warm-up: allocations, first-call dispatch
        best.append(timed(lambda w=worker, i=ids, m=learn: w.gradients(i, m), repeat=args.repeat)[0])  # synced
    del worker
    gc.collect()
    return best


def run(args, root: Path) -> int:
    import torch

    from calibrl.plan import shape_parameters

    torch.set_num_threads(os.cpu_count() or 1)
    counts = [int(c) for c in args.sequences.split(",")]
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 1 << 30, (args.prompt + args.response,), generator=g) for _ in range(max(counts))]
    learn = torch.tensor([0] * args.prompt + [1] * args.response)
    batches = [(seqs[:c], [learn] * c) for c in counts]
    times, size = {}, {}
    for role in ("memory", "policy"):
        shape, vocab, head_dim = _shape(role, args.quick)
        parts = [(shape["layers"], vocab)] if args.whole else [(1, SMALL_VOCAB), (2, SMALL_VOCAB), (1, vocab)]
        times[role] = [seconds(shape, head_dim, n, v, args, root, batches) for n, v in parts]
        size[role] = shape_parameters(shape, vocab, head_dim)
    sizes = size["memory"] / size["policy"]
    for k, count in enumerate(counts):
        total = {}
        for role in ("memory", "policy"):
            shape = _shape(role, args.quick)[0]
            name = "quick" if args.quick else ROLES[role]
            if args.whole:
                total[role] = times[role][0][k]
                print(f"{role} ({name}, {size[role] / 1e6:,.1f}M parameters): whole model {total[role]:.3f} s")
                continue
            one, two, full_vocab = (t[k] for t in times[role])
            layer, head = two - one, full_vocab - one
            if layer <= 0 or head <= 0:
                print(f"{role}: a part's time is inside the timer's noise (layer {layer:.4f} s, head {head:.4f} s: "
                      f"differences of whole passes); no ratio from it. Raise --repeat, use longer sequences, or "
                      f"run on an idle machine (load {os.getloadavg()[0]:.1f}).", file=sys.stderr)  # fmt: skip
                return 1
            total[role] = shape["layers"] * layer + head
            print(f"{role} ({name}, {size[role] / 1e6:,.1f}M parameters): layer {layer:.3f} s, head {head:.3f} s; "
                  f"{shape['layers']} x layer + head = {total[role]:.2f} s")  # fmt: skip
        time = total["memory"] / total["policy"]
        print(f"{count} x {len(seqs[0])} tokens ({args.response} learned each), micro-batches of at most "
              f"{args.max_tokens}; best of {args.repeat} after a warm-up; load {os.getloadavg()[0]:.1f}")  # fmt: skip
        print(ratio_line("memory update / policy update at equal tokens", time, f"parameters {sizes:.3f}x"))
        print(f"efficiency on this {args.device} (parameters ratio / time ratio): {sizes / time:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
