"""What one verl run costs, for the cluster planner (``GpuSide.train_cost``; the throughput model: ``calibrl.cost``).

verl's hybrid engine is colocated: generation of ``prompts_per_step x group_size`` responses on every GPU (vLLM
replicas of ``vllm_tensor_parallel_size`` GPUs; DLC: both stacks; DAPO: ``dapo_generation_factor`` times the batch),
in waves where a replica's share outgrows its KV cache, then the FSDP update on the same GPUs (DLC's memory update
after it), then ``step_overhead_s``. Disk: the evaluated Hugging Face checkpoints kept, and ``keep_ds_checkpoints``
resume states (FSDP shards and optimizer state, priced as DeepSpeed's: the same bytes per parameter).
"""

from __future__ import annotations

from calibrl import cost as C


def train_cost(p: C.RunPlan, a: dict) -> C.RunCost:
    tr, lay = p.train, p.layout
    n_params = C.parameters(p.model)
    gpus = int(lay["nodes"]) * int(lay["gpus_per_node"])
    tp = int(lay["vllm_tensor_parallel_size"])
    replicas = gpus // tp
    sequences = tr["prompts_per_step"] * tr["group_size"]
    mem_params = C.parameters(p.memory) if p.memory else 0
    engine = [p.model, *([p.memory] if p.memory else [])]
    try:
        waves = C.generation_waves(a, engine, sequences / replicas, tr["max_new_tokens"],
                                   float(lay["vllm_gpu_memory_utilization"]), tp)  # fmt: skip
    except ValueError as err:
        raise ValueError(f"{p.path}: {err} (its layout's vllm_gpu_memory_utilization)") from None
    gen = C.generation_seconds(a, p.model, sequences, tr["max_new_tokens"], gpus, tp, p.memory, waves)
    tokens = sequences * (a["prompt_tokens"] + a["response_fraction"] * tr["max_new_tokens"])
    sampled = a["dapo_generation_factor"] if p.spec.dapo else 1.0
    gen *= sampled
    flops = a["train_flops_per_param_token"] * n_params * tokens
    update = flops / (a["train_mfu"] * a["gpu_peak_tflops"] * 1e12 * gpus)
    if p.memory:  # after the policy's, on the same GPUs
        update += C.memory_update_seconds(a, p.memory, tokens * sampled, gpus)
    step = gen + update + a["step_overhead_s"]
    longest = max(b - e for b, e in zip(p.ends, [0, *p.ends]))
    start = C.startup_seconds(a, p.model, *([p.memory] if p.memory else []))
    segment_h = (longest * step + start) / 3600
    run_h = (tr["steps"] * step + len(p.ends) * start) / 3600
    keep = p.retention
    waiting = longest // int(tr["eval_every"])
    kept = min(p.checkpoints, 1 + len(keep["keep_steps"]) + waiting) if keep["remove_evaluated"] else p.checkpoints
    states = int(lay["keep_ds_checkpoints"])
    disk = kept * n_params * a["hf_bytes_per_param"] + states * n_params * a["ds_bytes_per_param"]
    if p.memory:
        disk += states * mem_params * a["memory_state_bytes_per_param"]
    note = (
        f"{p.path}: {len(p.ends)} segments of <= {longest} steps, {segment_h:.1f} h each; a step "
        f"{gen:.0f} s generation + {update:.0f} s training on {gpus} GPUs (verl, colocated)"
    )
    return C.RunCost(len(p.ends), gpus, int(lay["nodes"]), int(lay["gpus_per_node"]), run_h, segment_h, disk, note)
