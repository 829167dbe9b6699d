"""The throughput model the cluster planner prices a grid with (``calibrl.plan``), and what a GPU backend reports of
one run's cost (:class:`RunPlan` in, :class:`RunCost` out: ``GpuSide.train_cost``).

The model is stated, not measured: every number is in ``ASSUMPTIONS`` with where it comes from, overridable with
``calibrl plan --assume key=value``; model sizes come from the Qwen3 configs (``QWEN3``) or a downloaded folder's
config.json. ``calibrl.plan``'s docstring gives the formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibrl.spec import MethodSpec

# name: (value, where it comes from). Units in the name. Overridable: --assume name=value.
ASSUMPTIONS: dict[str, tuple[object, str]] = {
    "gpu_peak_tflops": (989.0, "NVIDIA H100 SXM datasheet: 989 TFLOPS dense BF16"),
    "gpu_hbm_tb_per_s": (3.35, "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3"),
    "gen_mfu": (0.35, "assumption: vLLM batched decode reaches ~1/3 of peak on the weight matmuls"),
    "gen_kv_efficiency": (0.6, "assumption: paged-attention KV reads at ~60% of HBM bandwidth"),
    "train_mfu": (0.3, "assumption: DeepSpeed ZeRO bf16 training, typical 30-40% MFU for 4-14B"),
    "train_flops_per_param_token": (12, "6N fwd+bwd + 2N recomputation + 2N old logprobs + 2N reference"),
    "response_fraction": (0.35, "assumption: mean response = 35% of max_new_tokens (Qwen3 non-thinking math)"),
    "prompt_tokens": (200, "assumption: mean rendered prompt (template + chat template + problem)"),
    "startup_fixed_s": (150.0, "assumption: a GPU job's start: Ray, DeepSpeed, vLLM profiling and CUDA graphs"),
    "weights_load_gb_per_s": (0.18, "assumption: weights read from the shared file system at job start"),
    "step_overhead_s": (30.0, "assumption: weight broadcast to vLLM, sleep/wake, logging per step"),
    "dapo_generation_factor": (1.5, "assumption: DAPO's dynamic sampling regenerates ~half a batch per step"),
    "data_bytes_per_problem": (1000, "assumption: one normalised JSONL row, problem + answer + metadata"),
    "hf_bytes_per_param": (2, "bf16 safetensors (OpenRLHF --ckpt.save_hf)"),
    "ds_bytes_per_param": (14, "DeepSpeed resume state: bf16 weights 2 + fp32 master 4 + Adam moments 8"),
    "memory_state_bytes_per_param": (12, "DLC memory actor's saved state per step: fp32 weights 4 + Adam 8"),
    "memory_flops_per_param_token": (8, "DLC memory update: 6N fwd+bwd + 2N recomputation (no old or ref forward)"),
    "memory_update_efficiency": (
        0.57,
        "measured on an H100 (2026-11-26): the memory update's rate per parameter-token over the policy update's "
        "(the same code, Qwen3-1.7B / Qwen3-8B shapes, full 9,216-token micro-batches): 0.63 with one, 0.57 with "
        "ten (benchmarks/memory_update_efficiency.py --device cuda --sequences 1,3,30; docs/cluster.md); the lower "
        "taken",
    ),
    "decode_alone_hbm_efficiency": (
        0.5,
        "assumption: a lone sequence decodes at ~50% of HBM bandwidth reading the weights (no batching)",
    ),
    "gpu_memory_gb": (
        85.0,
        "NVIDIA H100 SXM 80 GB: 79.19 GiB as CUDA reports it, the total vLLM's gpu_memory_utilization is a share of",
    ),
    "vllm_non_kv_gb": (
        3.0,
        "assumption: per GPU, what a vLLM engine holds beside its weights and KV cache (the activation peak it "
        "profiles, CUDA graphs, NCCL and cuBLAS workspaces)",
    ),
    "kv_bytes_per_value": (2, "bf16 KV cache: vLLM's kv_cache_dtype auto, the dtype of OpenRLHF's engines"),
    "kv_resident_fraction": (
        1.0,
        "assumption: at its peak a step's sequences hold the KV cache of their whole mean length (prompt + mean "
        "response); an upper bound within a step (those that finish early free theirs) that the steps whose "
        "responses run longer than the mean exceed",
    ),
    "runtime_margin": (1.5, "assumption: warn when an estimate x this margin outruns a SLURM runtime"),
    "eval_result_bytes": (4000, "one evaluation JSON (per split metrics)"),
    "download_gbit_per_s": (1.0, "assumption: login node to the Hub"),
    # The node the jobs pack onto. Yours: `scontrol show node <name>` (Gres, CPUTot, RealMemory).
    "node_gpus": (8, "assumption: a DGX H100-class node, 8 H100 SXM"),
    "node_cpus": (112, "assumption: a DGX H100-class node, 2 x 56-core Xeon 8480C, one SLURM CPU per core"),
    "node_mem_mb": (2_000_000, "assumption: a DGX H100-class node, 2 TB, less the system's share (SLURM MB)"),
}

# Qwen3 architectures, from each model's config.json on the Hub (vocab 151,936; head_dim 128).
QWEN3 = {
    "Qwen/Qwen3-0.6B": dict(hidden=1024, layers=28, heads=16, kv_heads=8, inter=3072, tied=True),
    "Qwen/Qwen3-1.7B": dict(hidden=2048, layers=28, heads=16, kv_heads=8, inter=6144, tied=True),
    "Qwen/Qwen3-4B": dict(hidden=2560, layers=36, heads=32, kv_heads=8, inter=9728, tied=True),
    "Qwen/Qwen3-8B": dict(hidden=4096, layers=36, heads=32, kv_heads=8, inter=12288, tied=False),
    "Qwen/Qwen3-14B": dict(hidden=5120, layers=40, heads=40, kv_heads=8, inter=17408, tied=False),
    "Qwen/Qwen3-32B": dict(hidden=5120, layers=64, heads=64, kv_heads=8, inter=25600, tied=False),
}
VOCAB, HEAD_DIM = 151936, 128


_DOWNLOADED: dict[str, dict] = {}  # hf_id -> shape, from a downloaded folder's config.json (:func:`learn_shape`)


def learn_shape(hf_id: str, c: dict) -> None:
    """Learn the shape of ``hf_id`` (a model ``QWEN3`` does not list) from its ``config.json`` (``c``)."""
    if hf_id in QWEN3 or hf_id in _DOWNLOADED:
        return
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    _DOWNLOADED[hf_id] = {
        "hidden": c["hidden_size"],
        "layers": c["num_hidden_layers"],
        "heads": c["num_attention_heads"],
        "kv_heads": c["num_key_value_heads"],
        "inter": c["intermediate_size"],
        "tied": bool(c.get("tie_word_embeddings")),
        "vocab": c["vocab_size"],
        "head_dim": head_dim,
    }


def _shape(hf_id: str) -> dict:
    shape = QWEN3.get(hf_id) or _DOWNLOADED.get(hf_id)
    if shape is None:
        raise ValueError(
            f"{hf_id}: no architecture known to the planner (calibrl.plan.QWEN3, or the config.json of its "
            "downloaded folder); add its config"
        )
    return shape


def parameters(hf_id: str) -> int:
    """Parameter count of a Qwen3 model from its config (embeddings, attention with q/k norms, SwiGLU MLP,
    RMSNorms, an untied LM head where the config unties it)."""
    c = _shape(hf_id)
    return shape_parameters(c, c.get("vocab", VOCAB), c.get("head_dim", HEAD_DIM))


def shape_parameters(c: dict, vocab: int = VOCAB, head_dim: int = HEAD_DIM) -> int:
    """:func:`parameters` of a ``QWEN3``-style shape (``benchmarks/`` prices its stand-ins with it)."""
    h, q, kv = c["hidden"], c["heads"] * head_dim, c["kv_heads"] * head_dim
    layer = h * q + 2 * h * kv + q * h + 2 * head_dim + 3 * h * c["inter"] + 2 * h
    return c["layers"] * layer + vocab * h * (1 if c["tied"] else 2) + h


def kv_bytes_per_token(hf_id: str, value_bytes: int = 2) -> int:
    """K and V of one token over all layers, ``value_bytes`` each value (bf16: 2)."""
    c = _shape(hf_id)
    return 2 * c["layers"] * c["kv_heads"] * c.get("head_dim", HEAD_DIM) * value_bytes


def kv_capacity_tokens(a: dict, models: list[str], utilization: float, tp: int = 1) -> float:
    """Tokens of KV cache one vLLM engine of ``tp`` GPUs holds at ``gpu_memory_utilization`` ``utilization``, as vLLM
    sizes it: its share of each GPU (``gpu_memory_gb``) less what it holds beside the cache (``vllm_non_kv_gb`` per
    GPU) and the bf16 weights of ``models`` (split over the ``tp`` GPUs), over the KV bytes of one token in every one
    of ``models`` (``kv_bytes_per_value`` a value; DLC's composite holds the policy and the memory, each stack's
    layers with their own cache from the one budget, so a token costs both). Below 0: the weights do not fit."""
    budget = tp * (a["gpu_memory_gb"] * utilization - a["vllm_non_kv_gb"]) * 1e9
    weights = sum(parameters(m) for m in models) * a["hf_bytes_per_param"]
    per_token = sum(kv_bytes_per_token(m, int(a["kv_bytes_per_value"])) for m in models)
    return (budget - weights) / per_token


def generation_waves(
    a: dict, models: list[str], sequences_per_engine: float, max_new: int, utilization: float, tp: int = 1
) -> float:
    """How many waves one engine generates a step's batch in: its concurrent sequences x their mean length
    (``prompt_tokens + response_fraction x max_new``, times ``kv_resident_fraction``) over its KV capacity
    (:func:`kv_capacity_tokens`); 1 when they fit. Beyond it vLLM preempts the newest sequences (their cache
    freed, recomputed when they resume) until running ones finish: the batch runs in waves (:func:`generation_seconds`).
    A ``ValueError`` when the engine's share does not hold its weights (vLLM would not start)."""
    capacity = kv_capacity_tokens(a, models, utilization, tp)
    if capacity <= 0:
        raise ValueError(
            f"a vLLM engine of {' + '.join(models)} on {tp} GPU(s) at gpu_memory_utilization {utilization:g}: "
            f"{a['gpu_memory_gb']:g} GB x {utilization:g} per GPU holds no KV cache beside the weights"
        )
    length = a["prompt_tokens"] + a["response_fraction"] * max_new
    return max(1.0, sequences_per_engine * length * a["kv_resident_fraction"] / capacity)


def assumptions(overrides: dict | None = None) -> dict:
    """The values of ``ASSUMPTIONS`` with ``overrides`` applied (unknown names refused, by name)."""
    values = {k: v for k, (v, _) in ASSUMPTIONS.items()}
    for key, value in (overrides or {}).items():
        base = key.split(".", 1)[0]
        if base not in values and base != "gen_tokens_per_s":
            raise ValueError(
                f"unknown planner assumption {key!r} (known: {', '.join(sorted(values))}, gen_tokens_per_s.<hf_id>)"
            )
        values[key] = float(value)
    return values


def gen_tokens_per_s(a: dict, hf_id: str, mean_context: float, memory: str | None = None) -> float:
    """Output tokens/s of one GPU generating with ``hf_id`` at a mean context of ``mean_context`` tokens; with DLC's
    ``memory``, both stacks run on every token (weights and KV cache of both)."""
    if f"gen_tokens_per_s.{hf_id}" in a and memory is None:
        return a[f"gen_tokens_per_s.{hf_id}"]
    models = [hf_id, *([memory] if memory else [])]
    compute = 2 * sum(map(parameters, models)) / (a["gen_mfu"] * a["gpu_peak_tflops"] * 1e12)
    kv = sum(map(kv_bytes_per_token, models)) * mean_context / (a["gen_kv_efficiency"] * a["gpu_hbm_tb_per_s"] * 1e12)
    return 1.0 / (compute + kv)


def generation_seconds(
    a: dict,
    hf_id: str,
    sequences: float,
    max_new: int,
    gpus: float,
    tp: int = 1,
    memory: str | None = None,
    waves: float = 1.0,
) -> float:
    """Wall seconds for ``sequences`` responses on ``gpus`` GPUs (engines of ``tp`` GPUs): prefill and decode of
    the batch, then its long tail (:func:`tail_seconds`); ``memory``: DLC's composite (both stacks). In ``waves``
    (:func:`generation_waves`, a training step's batch beyond its engines' KV cache) the same tokens are decoded,
    the preempted share of the sequences (``1 - 1 / waves``) prefills its mean context again when it resumes, and
    each wave ends in its own long tail: the longest sequences hold their cache to the end, so the preempted ones
    resume behind them."""
    params = parameters(hf_id) + (parameters(memory) if memory else 0)
    response = a["response_fraction"] * max_new
    decode = sequences * response / gen_tokens_per_s(a, hf_id, a["prompt_tokens"] + response / 2, memory)
    per_token = 2 * params / (a["train_mfu"] * a["gpu_peak_tflops"] * 1e12)  # prefill
    prefill = sequences * a["prompt_tokens"] * per_token
    recompute = (1 - 1 / waves) * sequences * (a["prompt_tokens"] + response / 2) * per_token
    return (decode + prefill + recompute) / gpus + waves * tail_seconds(a, params, max_new, tp)


def memory_update_seconds(a: dict, memory: str, tokens: float, gpus: int) -> float:
    """DLC's memory step on ``tokens`` (every sampled sequence, prompts included) over ``gpus`` ranks (FSDP):
    ``memory_flops_per_param_token x N_m`` FLOPs per token at ``train_mfu x memory_update_efficiency``."""
    flops = a["memory_flops_per_param_token"] * parameters(memory) * tokens
    return flops / (a["train_mfu"] * a["memory_update_efficiency"] * a["gpu_peak_tflops"] * 1e12 * gpus)


def tail_seconds(a: dict, params: float, max_new: int, tp: int = 1) -> float:
    """The long tail of a batch: its longest response (at the budget: some are truncated) finishes its last
    tokens alone, each token reading the engine's weights (``2 params / tp`` bytes per GPU) from HBM; an 8,192-token
    response of Qwen3-8B takes ~80 s so. Batched throughput does not cover it."""
    per_token = 2 * params / tp / (a["decode_alone_hbm_efficiency"] * a["gpu_hbm_tb_per_s"] * 1e12)
    return max_new * per_token


def startup_seconds(a: dict, *hf_ids: str) -> float:
    """A GPU job's start: fixed work plus reading its models' bf16 weights (Qwen3-8B: ~240 s)."""
    weights = sum(parameters(h) * a["hf_bytes_per_param"] for h in hf_ids)
    return a["startup_fixed_s"] + weights / (a["weights_load_gb_per_s"] * 1e9)


@dataclass(frozen=True)
class RunPlan:
    """What the planner knows of one training run before it is priced (``calibrl.plan.train_row``): ``train`` is
    ``grid.train``, ``layout`` the run's resources (its backend's), ``model`` and ``memory`` Hub ids (``memory``:
    DLC's, else None), ``ends`` its segments' last steps, ``checkpoints`` how many are evaluated, ``retention``
    ``grid.retention``."""

    path: str
    train: dict
    spec: MethodSpec
    layout: dict
    model: str
    memory: str | None
    ends: tuple[int, ...]
    checkpoints: int
    retention: dict


@dataclass(frozen=True)
class RunCost:
    """One run's cost as its backend prices it: ``jobs`` segments (SLURM jobs) of ``gpus`` GPUs on ``nodes`` nodes
    of ``gpus_per_node``, ``run_h`` hours in all, ``segment_h`` for the longest segment, ``disk_bytes`` at most."""

    jobs: int
    gpus: int
    nodes: int
    gpus_per_node: int
    run_h: float
    segment_h: float
    disk_bytes: float
    note: str
