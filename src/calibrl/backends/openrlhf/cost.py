"""What one OpenRLHF run costs, for the cluster planner (``GpuSide.train_cost``; the throughput model is
``calibrl.cost``'s).

A step is generation of ``prompts_per_step x group_size`` responses on the engine GPUs (DLC: both stacks; DAPO:
``dapo_generation_factor`` times the batch, its dynamic sampling's refills), in waves where an engine's share of the
batch outgrows its KV cache at the layout's ``vllm_gpu_memory_utilization`` (``calibrl.cost.generation_waves``;
DLC's composite holds two models' weights and caches: at 0.6 of an H100 ~107k tokens, some 55% of a step's 64
sequences per engine at their mean length), then the policy's update on the actor GPUs (and DLC's memory update:
after it on shared GPUs, beside it on GPUs of its own), then ``step_overhead_s``; OpenRLHF's PPO loop is
synchronous, so the job's GPUs are held for the sum. Disk: the evaluated checkpoints kept
(HF weights) and ``keep_ds_checkpoints`` DeepSpeed resume states (and the memory's, for DLC).
"""

from __future__ import annotations

from calibrl import cost as C
from calibrl.backends.openrlhf import layout as L


def train_cost(p: C.RunPlan, a: dict) -> C.RunCost:
    tr, lay = p.train, p.layout
    n_params = C.parameters(p.model)
    roles = L.run_roles(lay, p.spec)
    gpus = int(lay["nodes"]) * int(lay["gpus_per_node"])
    res = roles["resources"]
    gen_gpus = gpus if lay["colocate_all"] else res["vllm_engines"] * res["vllm_tensor_parallel_size"]
    sequences = tr["prompts_per_step"] * tr["group_size"]
    tp = int(res["vllm_tensor_parallel_size"])
    mem_params = C.parameters(p.memory) if p.memory else 0
    engine = [p.model, *([p.memory] if p.memory else [])]  # DLC's composite: both models' weights and KV caches
    utilization = float(lay["vllm_gpu_memory_utilization"])
    try:
        waves = C.generation_waves(a, engine, sequences / res["vllm_engines"], tr["max_new_tokens"], utilization, tp)
    except ValueError as err:
        raise ValueError(f"{p.path}: {err} (its layout's vllm_gpu_memory_utilization)") from None
    gen = C.generation_seconds(a, p.model, sequences, tr["max_new_tokens"], gen_gpus, tp, p.memory, waves)
    tokens = sequences * (a["prompt_tokens"] + a["response_fraction"] * tr["max_new_tokens"])
    flops = a["train_flops_per_param_token"] * n_params * tokens
    sampled = a["dapo_generation_factor"] if p.spec.dapo else 1.0
    gen *= sampled
    train = flops / (a["train_mfu"] * a["gpu_peak_tflops"] * 1e12 * roles["actor_gpus"])
    update = train
    if p.memory:  # every sampled sequence, DAPO's dropped groups too; after the policy's on shared GPUs, else beside
        mem = C.memory_update_seconds(a, p.memory, tokens * sampled, roles["memory_ranks"])
        update = train + mem if lay["colocate_all"] else max(train, mem)
    step = gen + update + a["step_overhead_s"]
    longest = max(b - e for b, e in zip(p.ends, [0, *p.ends]))
    start = C.startup_seconds(a, p.model, *([p.memory] if p.memory else []))
    segment_h = (longest * step + start) / 3600
    run_h = (tr["steps"] * step + len(p.ends) * start) / 3600
    keep = p.retention
    # removed once evaluated: the newest, the kept steps, and about one segment's worth awaiting evaluation
    waiting = longest // int(tr["eval_every"])
    kept = min(p.checkpoints, 1 + len(keep["keep_steps"]) + waiting) if keep["remove_evaluated"] else p.checkpoints
    # DeepSpeed states: OpenRLHF keeps --ckpt.max_num (rotated before each save); no final/ model (launch.py)
    states = int(res["keep_ds_checkpoints"])
    disk = kept * n_params * a["hf_bytes_per_param"] + states * n_params * a["ds_bytes_per_param"]
    if p.memory:  # the memory's weights in each policy checkpoint's engine copy, and its state per kept step
        disk += kept * mem_params * a["hf_bytes_per_param"] + states * mem_params * a["memory_state_bytes_per_param"]
    note = (
        f"{p.path}: {len(p.ends)} segments of <= {longest} steps, {segment_h:.1f} h each; a step "
        f"{gen:.0f} s generation + {update:.0f} s training on {gpus} GPUs"
    )
    if waves > 1:
        note += f" (generation in {waves:.2f} waves: the engines' KV cache holds {1 / waves:.0%} of a batch)"
    return C.RunCost(len(p.ends), gpus, int(lay["nodes"]), int(lay["gpus_per_node"]), run_h, segment_h, disk, note)
