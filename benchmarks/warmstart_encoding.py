"""The warm start's batch encoding: one tokenizer call per list (calibrl.models.encode_examples) against one per row.

    .venv/bin/python benchmarks/warmstart_encoding.py [--steps 50] [--repeat 3] [--quick]

Every warm-start step encodes a fresh batch of 64 (prompt, sampled answer) pairs (``grid.warmstart.batch_size``,
``calibrl.backends.local.warmstart``). The baseline is the encoder as it was: a tokenizer call for each prompt and
each answer and a tensor slice per row. The command checks that both give identical tensors, then times the
encoding alone and whole warm-start steps (encode, forward, backward, clipping, AdamW) of the embedded default's two
architectures, the policy (qwen3-tiny-m) and DLC's memory model (qwen3-tiny-xs), on one torch thread as every job
runs. Each time is the best of ``--repeat`` passes of ``--steps`` steps.
"""

from __future__ import annotations

import argparse
import random
import sys

from _common import machine, ratio_line, timed

ARCHS = {
    "qwen3-tiny-m": dict(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=128),
    "qwen3-tiny-xs": dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
}


def encode_per_row(tokenizer, prompts, answers):
    """The baseline: the encoder before, a tokenizer call per string and a tensor per row."""
    import torch

    eos = tokenizer.eos_token_id
    rows = []
    for prompt, answer in zip(prompts, answers):
        p = [tokenizer.bos_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos]
        rows.append((p, a))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        ids[i, width - len(seq) :] = torch.tensor(seq)
        mask[i, width - len(seq) :] = True
        labels[i, width - len(a) :] = torch.tensor(a)
    return ids, mask, labels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="warm-start steps per timed pass")
    parser.add_argument("--batch-size", type=int, default=64, help="grid.warmstart.batch_size")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per variant (best kept)")
    parser.add_argument("--quick", action="store_true", help="5 steps, one pass: for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeat = 5, 1

    import torch

    from calibrl.data import countdown
    from calibrl.models import build_model, build_tokenizer, encode_examples
    from calibrl.sampling import position_ids_from_mask
    from calibrl.tasks import format_prompt

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    records = countdown.generate("sft", args.steps * args.batch_size, seed=0)
    rng = random.Random(0)
    batches = []
    for start in range(0, len(records), args.batch_size):
        chunk = records[start : start + args.batch_size]
        prompts = [format_prompt(r, "{problem}:") for r in chunk]
        batches.append((prompts, [countdown.sample_solution(r, rng) for r in chunk]))
    for prompts, answers in batches:
        ours, theirs = encode_examples(tokenizer, prompts, answers), encode_per_row(tokenizer, prompts, answers)
        if not all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs)):
            print("the two encoders gave different tensors", file=sys.stderr)
            return 1
    print(f"machine: {machine()}; torch threads 1")
    print(f"{len(batches)} batches of {args.batch_size} countdown examples each, identical tensors from both encoders")

    def encode_all(encode):
        return [encode(tokenizer, p, a) for p, a in batches]

    t_ours, _ = timed(lambda: encode_all(encode_examples), args.repeat)
    t_theirs, _ = timed(lambda: encode_all(encode_per_row), args.repeat)
    print(f"encoding: {t_ours / len(batches) * 1e3:.2f} ms per batch, per row {t_theirs / len(batches) * 1e3:.2f} ms")
    print(ratio_line("warm-start batch encoding, per row / per list", t_theirs / t_ours))

    for name, arch in ARCHS.items():

        def steps(encode, arch=arch):
            model = build_model(tokenizer, seed=0, **arch).train()
            opt = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
            for prompts, answers in batches:
                ids, mask, labels = encode(tokenizer, prompts, answers)
                positions = position_ids_from_mask(mask)
                out = model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels)
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            return out.loss.item()

        steps(encode_examples)  # warm-up
        t_ours, loss_ours = timed(lambda s=steps: s(encode_examples), args.repeat)
        t_theirs, loss_theirs = timed(lambda s=steps: s(encode_per_row), args.repeat)
        if loss_ours != loss_theirs:
            print(f"{name}: the two encoders trained differently", file=sys.stderr)
            return 1
        per_step = f"{t_ours / len(batches) * 1e3:.1f} ms per step, per row {t_theirs / len(batches) * 1e3:.1f} ms"
        print(f"{name}: {per_step} (same final loss)")
        print(ratio_line(f"warm-start step, per row / per list encoding ({name})", t_theirs / t_ours))
    return 0


if __name__ == "__main__":
    sys.exit(main())
