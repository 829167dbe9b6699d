"""DLC sampling cost: calibrl.sampling.sample with a memory model against plain policy sampling.

    .venv/bin/python benchmarks/dlc_sampling.py [--prompts 16] [--group-size 8] [--tokens 32] [--quick]

For each (policy, memory) size pair, on the same prompts and for the same number of generated tokens:

- t(policy): ``sample`` from the policy alone; t(memory): ``sample`` from the memory model alone;
- t(DLC): ``sample`` from softmax(f_theta - mu * f_phi), both models' KV caches advanced in one loop;
- t(naive): transformers ``generate`` on the policy with a ``LogitsProcessor`` that runs the memory model
  on the whole sequence at every step (no cache for the memory model), the obvious alternative.

The cost floor of DLC is 1 + t(memory) / t(policy) (both models must run once per token); the target is
t(DLC) / t(policy) within 1.15x of that floor. Models are freshly initialised tiny Qwen3s (near-uniform
next-token distributions, so no row ends early and every run generates the full ``--tokens``); each time
is the best of ``--repeat`` runs, on ``--threads`` torch threads (the workflow's jobs use one).
"""

from __future__ import annotations

import argparse
import sys

from _common import machine, ratio_line, timed

# (name, policy architecture, memory architecture): the embedded default's pair first.
PAIRS = (
    (
        "tiny-m / tiny-xs (the embedded default)",
        dict(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=128),
        dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
    ),
    (
        "256d-6L / 128d-2L",
        dict(hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=768),
        dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=384),
    ),
    (
        "equal sizes 128d-3L",
        dict(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=384),
        dict(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_size=384),
    ),
)
PROMPTS = ["3 7 12 5 -> 15:", "1 2 -> 3:", "10 4 6 9 2 -> 19:", "8 8 -> 16:"]


def memory_processor(memory, mu: float, pad_id: int):
    """The naive DLC: a LogitsProcessor that reruns the memory model on the full sequence every step."""
    import torch
    from transformers import LogitsProcessor

    from calibrl.algo.dlc import calibrated_logits
    from calibrl.sampling import position_ids_from_mask

    class MemoryProcessor(LogitsProcessor):
        def __call__(self, input_ids, scores):
            mask = input_ids != pad_id
            with torch.no_grad():
                f_phi = memory(
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=position_ids_from_mask(mask),
                    logits_to_keep=1,
                ).logits[:, -1]
            return calibrated_logits(scores, f_phi.float(), mu)

    return MemoryProcessor()


def generate(policy, tokenizer, prompts, group_size, tokens, processors, seed, force_length=True):
    """``generate`` on the same left-padded batch as ``sample``; ``force_length`` holds every row to ``tokens``."""
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    from calibrl.sampling import encode_prompts

    ids, mask = encode_prompts(tokenizer, prompts)
    ids, mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
    config = GenerationConfig(
        do_sample=True,
        max_new_tokens=tokens,
        min_new_tokens=tokens if force_length else None,  # the same number of steps as the sampler's runs
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        return policy.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            logits_processor=LogitsProcessorList(processors),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per row")
    parser.add_argument("--mu", type=float, default=0.5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny size, for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.group_size, args.tokens, args.repeat = 2, 2, 4, 1

    import torch

    from calibrl.models import build_model, build_tokenizer
    from calibrl.sampling import sample

    torch.set_num_threads(args.threads)
    tokenizer = build_tokenizer()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    rows = args.prompts * args.group_size
    print(f"machine: {machine()}; torch threads {args.threads}")
    print(f"batch {args.prompts} prompts x {args.group_size} = {rows} rows, {args.tokens} new tokens, mu {args.mu}")
    pairs = PAIRS[:1] if args.quick else PAIRS
    within = 0
    for name, p_arch, m_arch in pairs:
        positions = 64 + args.tokens
        policy = build_model(tokenizer, max_position_embeddings=positions, seed=1, **p_arch)
        memory = build_model(tokenizer, max_position_embeddings=positions, seed=2, **m_arch)

        def run(model, mem=None, mu=0.0):
            gen = torch.Generator().manual_seed(0)
            roll = sample(model, tokenizer, prompts, args.group_size, args.tokens, memory=mem, mu=mu, generator=gen)
            return roll.response_mask.shape[1]

        sample(policy, tokenizer, prompts[:1], 1, 2)  # first-call warm-up (lazy inits) outside the timings
        # Default arguments bind this iteration's models (the lambdas are called before the loop moves on).
        t_pol, steps_pol = timed(lambda p=policy: run(p), args.repeat)
        t_mem, steps_mem = timed(lambda m=memory: run(m), args.repeat)
        t_dlc, steps_dlc = timed(lambda p=policy, m=memory: run(p, m, args.mu), args.repeat)
        procs = [memory_processor(memory, args.mu, tokenizer.pad_token_id)]
        gen_args = (tokenizer, prompts, args.group_size, args.tokens)
        t_naive, _ = timed(lambda p=policy, ps=procs, a=gen_args: generate(p, *a, ps, 0), args.repeat)
        t_gen, _ = timed(lambda p=policy, a=gen_args: generate(p, *a, [], 0), args.repeat)

        params = (sum(p.numel() for p in policy.parameters()), sum(p.numel() for p in memory.parameters()))
        floor = 1 + t_mem / t_pol
        dlc = t_dlc / t_pol
        within += dlc <= 1.15 * floor
        print(
            f"\n{name}: policy {params[0]:,} params, memory {params[1]:,} params "
            f"(memory/policy {params[1] / params[0]:.2f})"
        )
        print(
            f"  t(policy) {t_pol * 1e3:.0f} ms, t(memory) {t_mem * 1e3:.0f} ms, t(DLC) {t_dlc * 1e3:.0f} ms, "
            f"t(generate + memory LogitsProcessor) {t_naive * 1e3:.0f} ms, "
            f"t(generate, policy only) {t_gen * 1e3:.0f} ms; "
            f"steps {steps_pol}/{steps_mem}/{steps_dlc}"
        )
        print(ratio_line("DLC / policy-only sampling", dlc, f"floor 1 + t(memory)/t(policy) = {floor:.2f}"))
        print(ratio_line("DLC / floor", dlc / floor, "target <= 1.15"))
        print(ratio_line("naive generate+LogitsProcessor DLC / policy-only sampling", t_naive / t_pol))
        print(ratio_line("naive generate+LogitsProcessor DLC / joint-cache DLC", t_naive / t_dlc))
    print(f"\nsize pairs within 1.15x of the floor: {within} of {len(pairs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
