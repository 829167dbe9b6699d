"""The CPU sampler with the prompt read once per problem against once per sample, at the embedded default's shapes.

    .venv/bin/python benchmarks/sampler_prefill.py [--problems 128] [--repeat 3] [--quick]

``calibrl.sampling.sample`` reads each distinct prompt once and repeats its KV cache for the group. The baseline is
the same function given every prompt ``G`` times with a group of one: the prompt read once per sample, as the
sampler did before. Both draw from the same generator, so their samples must match; the command checks that
they do before timing anything.

The model is a freshly initialised qwen3-tiny-m (the embedded default's policy) on countdown problems of the
test split. A random model writes all ``--tokens`` tokens; a trained one stops after a few, so the prompt's share
of the work, and the gain, is larger in a real evaluation (``docs``: issue 33's closing note has the measured
evaluation per checkpoint). One torch thread, as every job of the embedded default runs.

Shapes: evaluation (64 problems per batch x 32 samples, ``calibrl.evaluate.local``) and training rollouts (16
prompts x G = 8, ``grid.train``). Samples per second count every sampled response.
"""

from __future__ import annotations

import argparse
import sys

from _common import machine, ratio_line, timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=128, help="countdown problems sampled per shape")
    parser.add_argument("--tokens", type=int, default=10, help="new tokens per sample (grid.eval.max_new_tokens)")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per variant (best kept)")
    parser.add_argument("--quick", action="store_true", help="8 problems, one pass: for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.problems, args.repeat = 8, 1

    import torch

    from calibrl.data import countdown
    from calibrl.models import build_model, build_tokenizer
    from calibrl.sampling import sample
    from calibrl.tasks import format_prompt

    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    policy = build_model(tokenizer, max_position_embeddings=64, seed=1, hidden_size=64, num_layers=3, num_heads=4,
                         num_kv_heads=2, intermediate_size=128).eval()  # fmt: skip
    prompts = [format_prompt(r, "{problem}:") for r in countdown.generate("test", args.problems, seed=0)]
    print(f"machine: {machine()}; torch threads 1")
    print(f"model: qwen3-tiny-m, {sum(p.numel() for p in policy.parameters()):,} parameters; {len(prompts)} problems")

    def run(batch: int, group: int, shared: bool):
        generator = torch.Generator().manual_seed(0)
        texts = []
        with torch.inference_mode():
            for start in range(0, len(prompts), batch):
                chunk = prompts[start : start + batch]
                if shared:
                    roll = sample(policy, tokenizer, chunk, group, args.tokens, generator=generator)
                else:
                    rows = [p for p in chunk for _ in range(group)]
                    roll = sample(policy, tokenizer, rows, 1, args.tokens, generator=generator)
                texts += roll.texts
        return texts

    for name, batch, group in (("evaluation", 64, 32), ("training rollouts", 16, 8)):
        if run(batch, group, True) != run(batch, group, False):  # also the warm-up
            print(f"{name}: the two variants sampled different responses", file=sys.stderr)
            return 1
        t_shared, _ = timed(lambda b=batch, g=group: run(b, g, True), args.repeat)
        t_rows, _ = timed(lambda b=batch, g=group: run(b, g, False), args.repeat)
        samples = len(prompts) * group
        rates = f"per problem {samples / t_shared:,.0f} samples/s, per sample {samples / t_rows:,.0f} samples/s"
        print(f"\n{name} ({batch} prompts x {group} samples per batch, {samples} samples, identical): prompt {rates}")
        print(ratio_line(f"sampler throughput, prompt read once per problem / per sample ({name})", t_rows / t_shared))
    return 0


if __name__ == "__main__":
    sys.exit(main())
