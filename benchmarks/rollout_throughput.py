"""Rollout throughput: the local trainer's sampler (calibrl.sampling.sample) against transformers `generate`.

    .venv/bin/python benchmarks/rollout_throughput.py [--prompts 16] [--group-size 8] [--tokens 10 48] [--quick]

Same tiny Qwen3 (the embedded default's qwen3-tiny-m architecture, freshly initialised), same prompts, same
batch (prompts x group size rows, left-padded), sampling at temperature 1 with no top-k / top-p, the same
limit of new tokens per row; both stop once every row has emitted ``<eos>``. Tokens/s counts generated tokens
up to and including each row's ``<eos>`` (the useful tokens; both also spend steps on rows already finished).
Each time is the best of ``--repeat`` runs on ``--threads`` torch threads (the trainer uses one).
"""

from __future__ import annotations

import argparse
import sys

from _common import machine, ratio_line, timed
from dlc_sampling import PAIRS, PROMPTS, generate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16, help="the embedded default's prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, nargs="+", default=[10, 48], help="new tokens per row (one run each)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny size, for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.group_size, args.tokens, args.repeat = 2, 2, [4], 1

    import torch

    from calibrl.models import build_model, build_tokenizer
    from calibrl.sampling import encode_prompts, sample

    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    policy = build_model(tokenizer, max_position_embeddings=64 + max(args.tokens), seed=1, **PAIRS[0][1])
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    rows = args.prompts * args.group_size
    print(f"machine: {machine()}; torch threads {args.threads}")
    print(f"model: qwen3-tiny-m architecture, {sum(p.numel() for p in policy.parameters()):,} params; {rows} rows")
    sample(policy, tokenizer, prompts[:1], 1, 2)  # first-call warm-up outside the timings
    prompt_width = encode_prompts(tokenizer, prompts)[0].shape[1]
    for tokens in args.tokens:

        def ours(tokens=tokens):
            roll = sample(
                policy, tokenizer, prompts, args.group_size, tokens, generator=torch.Generator().manual_seed(0)
            )
            return int(roll.response_mask.sum())

        def theirs(tokens=tokens):
            out = generate(policy, tokenizer, prompts, args.group_size, tokens, [], 0, force_length=False)
            out = out[:, prompt_width:]
            # generated tokens up to and including the first <eos>, as the sampler's response_mask counts them
            after_eos = (out == tokenizer.eos_token_id).long().cumsum(-1) - (out == tokenizer.eos_token_id).long()
            return int((after_eos == 0).sum())

        t_ours, n_ours = timed(ours, args.repeat)
        t_gen, n_gen = timed(theirs, args.repeat)
        print(
            f"\n{tokens} new tokens: sample {n_ours} tokens in {t_ours * 1e3:.0f} ms "
            f"({n_ours / t_ours:,.0f} tokens/s); "
            f"generate {n_gen} tokens in {t_gen * 1e3:.0f} ms ({n_gen / t_gen:,.0f} tokens/s)"
        )
        print(
            ratio_line(
                f"sampler / generate tokens per second ({tokens} new tokens)", (n_ours / t_ours) / (n_gen / t_gen)
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
