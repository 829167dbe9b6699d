"""What a grid costs before anything is submitted: GPU-hours, wall time and disk per rule and in total.

``calibrl plan --configfile config/paper.yaml`` prints the estimate; ``check_runtimes`` compares each job's
wall time with the SLURM profile's ``runtime`` (read only) and warns where a job would be killed.

The estimate is a stated throughput model, not a measurement. Every number it uses is in ``ASSUMPTIONS``
below, each with where it comes from; any of them is overridden with ``--assume key=value`` (or a YAML file
of such keys, ``--assumptions FILE``). Model sizes come from the Qwen3 configs (``QWEN3``: the fields of
each model's ``config.json`` on the Hub), so parameter counts, checkpoint bytes and KV-cache bytes are
computed, not assumed.

Throughput model (per GPU, bf16):

* generation (vLLM, large batches, decode-dominated): each output token costs the weight matmuls,
  ``2 N`` FLOPs at ``gen_mfu`` of peak, plus reading its sequence's KV cache, ``kv_bytes_per_token(model) x
  mean context`` at ``gen_kv_efficiency`` of HBM bandwidth; tokens/s = 1 / (compute time + KV time).
  Prompt tokens are prefilled at ``train_mfu`` of peak (2 N FLOPs each). ``--assume gen_tokens_per_s.<hf_id>=X``
  replaces the formula for a model by a measured figure.
* training (OpenRLHF, DeepSpeed): ``train_flops_per_param_token x N`` FLOPs per (prompt + response) token at
  ``train_mfu`` of peak on the actor GPUs (fwd + bwd 6N, activation recomputation 2N, the old-policy
  forward 2N, the reference forward 2N).
* generation ends with its long tail: the longest response (at the budget) finishes alone, each token reading
  the engine's weights from HBM (``tail_seconds``);
* a training step = generation of ``prompts_per_step x group_size`` responses on the engine GPUs, then
  training on the actor GPUs, then ``step_overhead_s`` (weight sync, sleep/wake); the phases do not overlap
  (OpenRLHF's synchronous PPO loop), so the job's GPUs are all held for the sum.

Packing (the wall time on ``--gpus`` GPUs): a node (``node_gpus``, ``node_cpus``, ``node_mem_mb``) holds as many
jobs of a rule as fit by GPUs, by CPUs and by memory, the least of the three; the CPUs (``cpus_per_task``) and
memory (``mem_mb``, per node) a job asks for are read from the SLURM profile(s) as Snakemake merges them
(:func:`read_profile`, :func:`slurm_requests`; ``calibrl plan --profile slurm --profile slurm/smoke``). A job then
holds ``node_gpus / jobs per node`` GPUs of each of its nodes, used or not. Without a profile, GPUs alone count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from calibrl import grid as G
from calibrl.backends.openrlhf import layout as L

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


_DOWNLOADED: dict[str, dict] = {}  # hf_id -> shape, from a downloaded folder's config.json (:func:`learn`)


def learn(config: dict) -> None:
    """Learn the shape of each model of the grid that ``QWEN3`` does not list from its downloaded folder's
    config.json, where that folder exists (a model downloaded before the plan, or the CPU rehearsal's tiny ones)."""
    import json

    for model in G.run_models(config):
        hf_id = _hf(config, model)
        folder = Path(G.model_path(config, model))
        if hf_id in QWEN3 or hf_id in _DOWNLOADED or not (folder / "config.json").is_file():
            continue
        c = json.loads((folder / "config.json").read_text())
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


def kv_bytes_per_token(hf_id: str) -> int:
    """bf16 K and V of one token over all layers."""
    c = _shape(hf_id)
    return 2 * c["layers"] * c["kv_heads"] * c.get("head_dim", HEAD_DIM) * 2


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
    a: dict, hf_id: str, sequences: float, max_new: int, gpus: float, tp: int = 1, memory: str | None = None
) -> float:
    """Wall seconds for ``sequences`` responses on ``gpus`` GPUs (engines of ``tp`` GPUs): prefill and decode of
    the batch, then its long tail (:func:`tail_seconds`); ``memory``: DLC's composite (both stacks)."""
    params = parameters(hf_id) + (parameters(memory) if memory else 0)
    response = a["response_fraction"] * max_new
    decode = sequences * response / gen_tokens_per_s(a, hf_id, a["prompt_tokens"] + response / 2, memory)
    prefill = sequences * a["prompt_tokens"] * 2 * params / (a["train_mfu"] * a["gpu_peak_tflops"] * 1e12)
    return (decode + prefill) / gpus + tail_seconds(a, params, max_new, tp)


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


def data_rows(config: dict) -> tuple[int, int]:
    """(training rows, evaluation problems): each data set's published size (``BenchmarkSpec.rows``; countdown's:
    ``grid.data.splits``), at most ``grid.data.subset`` per file where set."""
    from calibrl.data.benchmarks import get_spec

    data = config["grid"]["data"]
    if data["source"] == "countdown":
        size = data["splits"]
        return size["train"], sum(size[k] for k in data["eval_splits"])
    cap = data.get("subset") or math.inf
    train = min(get_spec(data["train"]).rows, cap)
    return train, sum(min(get_spec(k).rows, cap) for k in data["eval_splits"])


@dataclass
class Row:
    """One rule of the plan: ``jobs`` jobs of ``gpus`` GPUs each, ``wall_h`` hours for the longest, ``disk_gb``
    in all; ``summed_gpu_hours`` where the jobs differ (training runs, evaluations of different models)."""

    rule: str
    jobs: int
    gpus: float
    wall_h: float
    disk_gb: float
    note: str = ""
    summed_gpu_hours: float | None = None
    job_h: float | None = None  # one job's hours where a job is part of the row (a training segment)
    held_gpus: float | None = None  # GPUs a job keeps from others: its nodes' GPUs / jobs per node (:func:`fit`)
    per_node: str = ""  # how many of its jobs fit a node, and by what

    @property
    def gpu_hours(self) -> float:
        if self.summed_gpu_hours is not None:
            return self.summed_gpu_hours
        return self.jobs * self.gpus * self.wall_h

    @property
    def held_gpu_hours(self) -> float:
        """``gpu_hours`` counting the GPUs its jobs leave idle on their nodes (CPUs or memory taken)."""
        if not self.gpus or self.held_gpus is None:
            return self.gpu_hours
        return self.gpu_hours * self.held_gpus / self.gpus


@dataclass(frozen=True)
class Request:
    """What one job of a rule asks SLURM for on each of its nodes besides GPUs (``cpus_per_task``, ``mem_mb``), each
    value with the profile key it comes from; ``None`` where the profile gives none."""

    cpus: float | None = None
    mem_mb: float | None = None
    cpus_key: str = ""
    mem_mb_key: str = ""


def fit(a: dict, gpus_per_node: float, request: Request | None = None) -> tuple[int, dict[str, int]]:
    """How many jobs of ``gpus_per_node`` GPUs and ``request`` one node (``node_gpus``, ``node_cpus``,
    ``node_mem_mb``) holds: the least of its fits by GPUs, by CPUs and by memory (the dict: each that applies)."""

    def per(have: float, want: float) -> int:
        return math.floor(have / want + 1e-9)

    fits = {}
    if gpus_per_node:
        fits["GPUs"] = per(a["node_gpus"], gpus_per_node)
    if request is not None and request.cpus:
        fits["CPUs"] = per(a["node_cpus"], request.cpus)
    if request is not None and request.mem_mb:
        fits["memory"] = per(a["node_mem_mb"], request.mem_mb)
    return (min(fits.values()) if fits else 0), fits


def _pack(row: Row, a: dict, nodes: int, gpus_per_node: float, request: Request | None) -> Row:
    """Set ``row.held_gpus`` (the GPUs its jobs keep from others) and ``row.per_node`` from :func:`fit`."""
    k, fits = fit(a, gpus_per_node, request)
    row.held_gpus = nodes * a["node_gpus"] / max(k, 1)
    by = [name for name, n in fits.items() if n == k]
    if request is None:  # no profile read: its CPUs and memory are not known
        by = ["GPUs alone"]
    row.per_node = f"{k} per node (by {' and '.join(by)})" if k else "fits no node (see the problems below)"
    return row


def _request(requests: dict | None, rule: str) -> Request | None:
    if requests is None:
        return None
    return requests.get(rule) or requests.get("*")


def _gb(n: float) -> float:
    return n / 1e9


def _hf(config: dict, model: str) -> str:
    grid = config["grid"]
    spec = {**grid["models"], **grid["memory_models"]}[model]
    if "hf_id" not in spec:
        raise ValueError(f"grid.models.{model}: the planner sizes Hub models (hf_id); tiny models cost nothing")
    return spec["hf_id"]


def _eval_gpus(config: dict) -> int:
    ev = config["grid"]["eval"]
    return int(ev["data_parallel_size"]) * int(ev["tensor_parallel_size"])


def train_row(config: dict, run: G.Run, a: dict, request: Request | None = None) -> Row:
    """One training run (``grid.train``, its layout (``calibrl.backends.openrlhf.layout``), its method's extra work);
    ``jobs`` is its number of segments, ``wall_h`` the longest segment's hours (one SLURM job); packed onto nodes
    with the ``request`` of rule train (:func:`fit`)."""
    grid = config["grid"]
    tr = grid["train"]
    hf = _hf(config, run.model)
    n_params = parameters(hf)
    m = G.method(config, run.method)
    lay = G.resources(config, run)
    roles = L.run_roles(lay, m)
    gpus = int(lay["nodes"]) * int(lay["gpus_per_node"])
    res = roles["resources"]
    gen_gpus = gpus if lay["colocate_all"] else res["vllm_engines"] * res["vllm_tensor_parallel_size"]
    actor_gpus = roles["actor_gpus"]
    sequences = tr["prompts_per_step"] * tr["group_size"]
    tp = int(res["vllm_tensor_parallel_size"])
    memory = G.memory_of(grid, run.model) if m.uses_dlc else None
    mem_hf = _hf(config, memory) if memory else None
    mem_params = parameters(mem_hf) if memory else 0
    gen = generation_seconds(a, hf, sequences, tr["max_new_tokens"], gen_gpus, tp, mem_hf)  # DLC: both stacks
    tokens = sequences * (a["prompt_tokens"] + a["response_fraction"] * tr["max_new_tokens"])
    flops = a["train_flops_per_param_token"] * n_params * tokens
    sampled = a["dapo_generation_factor"] if m.dapo else 1.0
    gen *= sampled
    train = flops / (a["train_mfu"] * a["gpu_peak_tflops"] * 1e12 * actor_gpus)
    update = train
    if memory:  # every sampled sequence, DAPO's dropped groups too; after the policy's on shared GPUs, else beside
        mem = memory_update_seconds(a, mem_hf, tokens * sampled, roles["memory_ranks"])
        update = train + mem if lay["colocate_all"] else max(train, mem)
    step = gen + update + a["step_overhead_s"]
    ends = G.segment_ends(config, run)
    longest = max(b - e for b, e in zip(ends, [0, *ends]))
    start = startup_seconds(a, hf, *([_hf(config, memory)] if memory else []))
    segment_h = (longest * step + start) / 3600
    run_h = (tr["steps"] * step + len(ends) * start) / 3600
    checkpoints = len(G.eval_steps(config))
    keep = G.retention(config)
    # removed once evaluated: the newest, the kept steps, and about one segment's worth awaiting evaluation
    waiting = longest // int(tr["eval_every"])
    kept = min(checkpoints, 1 + len(keep["keep_steps"]) + waiting) if keep["remove_evaluated"] else checkpoints
    # DeepSpeed states: OpenRLHF keeps --ckpt.max_num (rotated before each save); no final/ model (launch.py)
    states = int(res["keep_ds_checkpoints"])
    disk = kept * n_params * a["hf_bytes_per_param"] + states * n_params * a["ds_bytes_per_param"]
    if memory:  # the memory's weights in each policy checkpoint's engine copy, and its state per kept step
        disk += kept * mem_params * a["hf_bytes_per_param"] + states * mem_params * a["memory_state_bytes_per_param"]
    note = (
        f"{run.path}: {len(ends)} segments of <= {longest} steps, {segment_h:.1f} h each; a step "
        f"{gen:.0f} s generation + {update:.0f} s training on {gpus} GPUs"
    )
    row = Row("train", len(ends), gpus, run_h, _gb(disk), note, run_h * gpus, segment_h)
    return _pack(row, a, int(lay["nodes"]), int(lay["gpus_per_node"]), request)


def plan(
    config: dict, overrides: dict | None = None, requests: dict[str, Request] | None = None
) -> tuple[list[Row], list[Row]]:
    """One row per rule, in workflow order, and one row per training run (summed into the ``train`` row).
    ``requests``: the CPUs and memory per rule from the SLURM profile (:func:`slurm_requests`), which with the
    node's size decide how many jobs share a node; without them, GPUs alone do."""
    a = assumptions(overrides)
    learn(config)
    grid = config["grid"]
    runs = G.runs(config)
    rows: list[Row] = []
    splits = ["train", *grid["data"]["eval_splits"]]
    train_rows, eval_problems = data_rows(config)
    data_bytes = (train_rows + eval_problems) * a["data_bytes_per_problem"]
    rows.append(Row("data_download", len(splits), 0, 5 / 60, _gb(data_bytes), "login node, CPU"))
    used = G.run_models(config)
    model_bytes = {m: parameters(_hf(config, m)) * a["hf_bytes_per_param"] for m in used}
    seconds = sum(model_bytes.values()) * 8 / (a["download_gbit_per_s"] * 1e9)
    rows.append(
        Row(
            "download_model",
            len(used),
            0,
            seconds / 3600 / max(len(used), 1),
            _gb(sum(model_bytes.values())),
            "login node: " + ", ".join(used),
        )
    )
    ranked = sorted({r.model for r, spec in G.run_specs(config) if spec.filters})
    if ranked:
        egpus = _eval_gpus(config)
        tr = grid["train"]
        tp = int(grid["eval"]["tensor_parallel_size"])
        walls = [
            startup_seconds(a, _hf(config, m))
            + generation_seconds(a, _hf(config, m), train_rows * tr["filter_samples"], tr["max_new_tokens"], egpus, tp)
            for m in ranked
        ]
        rank = Row("rank_train", len(ranked), egpus, max(walls) / 3600, 0.01, ", ".join(ranked))
        rows.append(_pack(rank, a, 1, egpus, _request(requests, "rank_train")))
    trains = [train_row(config, r, a, _request(requests, "train")) for r in runs]
    train = Row(
        "train",
        sum(t.jobs for t in trains),
        max(t.gpus for t in trains),
        max(t.job_h for t in trains),
        sum(t.disk_gb for t in trains),
        f"{len(trains)} runs in segments; longest segment shown, longest run {max(t.wall_h for t in trains):.0f} h",
        sum(t.gpu_hours for t in trains),
    )
    train.held_gpus = train.gpus * sum(t.held_gpu_hours for t in trains) / max(train.gpu_hours, 1e-12)
    train.per_node = "; ".join(dict.fromkeys(t.per_node for t in trains))
    rows.append(train)
    egpus = _eval_gpus(config)
    ev = grid["eval"]
    n_ckpt = len(G.eval_steps(config))
    evals = []
    tp = int(ev["tensor_parallel_size"])
    for r in runs:
        gen = generation_seconds(a, _hf(config, r.model), eval_problems * ev["n"], ev["max_new_tokens"], egpus, tp)
        evals.append((n_ckpt, startup_seconds(a, _hf(config, r.model)) + gen))
    bases = [(m, s) for m in grid["models"] for s in G.base_seeds(config, m)]  # rule evaluate_base: step 0 per seed
    for m, _ in bases:
        gen = generation_seconds(a, _hf(config, m), eval_problems * ev["n"], ev["max_new_tokens"], egpus, tp)
        evals.append((1, startup_seconds(a, _hf(config, m)) + gen))
    jobs = sum(j for j, _ in evals)
    evaluate = Row(
        "evaluate",
        jobs,
        egpus,
        max(w for _, w in evals) / 3600,
        _gb(jobs * a["eval_result_bytes"]),
        f"{len(runs)} runs x {n_ckpt} checkpoints + {len(bases)} base-model evaluations; longest shown",
        sum(j * w for j, w in evals) * egpus / 3600,
    )
    rows.append(_pack(evaluate, a, 1, egpus, _request(requests, "evaluate")))  # evaluate_base: sized as evaluate
    rows.append(Row("aggregate", 1, 0, 0.25, 0.05, "local rule, CPU"))
    return rows, trains


def totals(rows: list[Row], trains: list[Row] | None = None, gpus: int = 8) -> dict:
    """The whole grid: GPU-hours and disk summed over rules; wall time with every job of a rule running at
    once and the rules one after another (downloads, rank_train, the longest run, an evaluation, aggregate):
    an upper bound on the critical path with unlimited GPUs (only the filtering run waits for rank_train); and
    on ``gpus`` GPUs, at least the longer of that path and the GPU-hours the jobs hold (``held_gpu_hours``: the
    GPUs of their nodes that the CPUs and memory they take leave idle count too) spread over them."""
    by = {r.rule: r for r in rows}
    path = ["data_download", "download_model", "rank_train", "train", "evaluate", "aggregate"]
    hours = {name: by[name].wall_h for name in path if name in by}
    if trains:  # a run's segments follow one another: the longest run, not one segment
        hours["train"] = max(t.wall_h for t in trains)
    gpu_hours = sum(r.gpu_hours for r in rows)
    held = sum(r.held_gpu_hours for r in rows if not (trains and r.rule == "train"))
    held += sum(t.held_gpu_hours for t in trains or [])
    return {
        "gpu_hours": gpu_hours,
        "held_gpu_hours": held,
        "disk_gb": sum(r.disk_gb for r in rows),
        "critical_path_h": sum(hours.values()),
        "on_gpus_h": max(sum(hours.values()), held / gpus),
        "gpus": gpus,
    }


def profile_file(profile: str | Path) -> Path:
    """The YAML file of a profile as ``snakemake --profile`` names it: a folder holding ``config.yaml`` (or
    ``profile.yaml``), or the file itself (relative to the working directory)."""
    path = Path(profile)
    for candidate in (path / "config.yaml", path / "profile.yaml", path):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"profile {profile}: no such file, nor a folder holding config.yaml (from {Path.cwd()})")


def read_profile(*profiles: str | Path) -> dict:
    """The profiles merged as Snakemake 9 merges ``--profile A --profile B``: each later profile's top-level keys
    replace the earlier ones' whole (a later ``set-resources`` replaces every rule's); YTE templates
    (``__use_yte__: true``, as slurm/smoke/config.yaml) evaluated as Snakemake evaluates them."""
    import yte
    from yte.exceptions import YteError

    merged: dict = {}
    for profile in profiles:
        path = profile_file(profile)
        with path.open(encoding="utf-8") as stream:
            try:
                merged.update(yte.process_yaml(stream, require_use_yte=True) or {})
            except YteError as err:
                raise ValueError(f"profile {path}: {err}") from None
    return merged


def _profile(profile: str | Path | dict) -> dict:
    return profile if isinstance(profile, dict) else read_profile(profile)


def _value(value: object) -> object:
    return getattr(value, "value", value)  # Snakemake's Resource objects (workflow.resource_settings) hold .value


def _number(value: object) -> float | None:
    """A plain number; ``None`` for what Snakemake would evaluate per job (an expression over attempt, input)."""
    value = _value(value)
    if isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def slurm_requests(profile: str | Path | dict) -> dict[str, Request]:
    """The CPUs (``cpus_per_task``: one task per node) and memory (``mem_mb``, per node) one job of each rule asks
    for, from a profile (a path, or :func:`read_profile`'s merge): its ``set-resources`` entry, else the
    ``default-resources`` (``"*"``: the rules the profile does not name). Values that are expressions count as
    unknown."""
    data = _profile(profile)
    default = data.get("default-resources") or {}

    def request(rule: str, res: dict) -> Request:
        out = {}
        for key, name in (("cpus_per_task", "cpus"), ("mem_mb", "mem_mb")):
            for where, values in ((f"set-resources.{rule}", res), ("default-resources", default)):
                if key in values:
                    out[name], out[f"{name}_key"] = _number(values[key]), f"{where}.{key}"
                    break
        return Request(**out)

    out = {
        rule: request(rule, dict(res.items()))
        for rule, res in (data.get("set-resources") or {}).items()
        if hasattr(res, "items")
    }
    out["*"] = request("*", {})
    return out


NODE_RULES = ("train", "evaluate", "evaluate_base", "rank_train", "preflight")  # the GPU jobs, on the GPU nodes


def check_nodes(config: dict, requests: dict[str, Request] | None, overrides: dict | None = None) -> list[str]:
    """A problem per GPU job that no node can hold (``node_gpus``, ``node_cpus``, ``node_mem_mb``): more GPUs per
    node than a node has (the layout's ``gpus_per_node``, ``grid.eval``'s engines), or more CPUs or memory
    (the profile's ``cpus_per_task``, ``mem_mb``), each naming the key; SLURM would refuse or never start it."""
    a = assumptions(overrides)
    problems = []
    node = "--assume node_{0}=N for your node (scontrol show node: {1})"
    seen = set()
    for run in G.runs(config):
        if run.model in seen:
            continue
        seen.add(run.model)
        gpn = int(G.resources(config, run)["gpus_per_node"])
        if gpn > a["node_gpus"]:
            problems.append(
                f"PROBLEM grid.models.{run.model}.resources.gpus_per_node: {gpn} GPUs per node, a node has "
                f"{a['node_gpus']:g} ({node.format('gpus', 'Gres')})"
            )
    egpus = _eval_gpus(config)
    if egpus > a["node_gpus"]:
        problems.append(
            f"PROBLEM grid.eval: data_parallel_size x tensor_parallel_size = {egpus} GPUs on one node, a node has "
            f"{a['node_gpus']:g} ({node.format('gpus', 'Gres')})"
        )
    ranks = any(spec.filters for _, spec in G.run_specs(config))
    for rule in NODE_RULES:
        req = _request(requests, rule)
        if req is None or (rule == "rank_train" and not ranks):
            continue
        if req.cpus and req.cpus > a["node_cpus"]:
            problems.append(
                f"PROBLEM {rule}: {req.cpus_key} = {req.cpus:g} CPUs per node, a node has {a['node_cpus']:g} "
                f"({node.format('cpus', 'CPUTot')}): SLURM cannot place the job"
            )
        if req.mem_mb and req.mem_mb > a["node_mem_mb"]:
            problems.append(
                f"PROBLEM {rule}: {req.mem_mb_key} = {req.mem_mb:g} MB per node, a node has {a['node_mem_mb']:g} "
                f"({node.format('mem_mb', 'RealMemory')}): SLURM cannot place the job"
            )
    return problems


def slurm_runtimes(profile: str | Path | dict) -> dict[str, float]:
    """``runtime`` (minutes) per rule in a Snakemake SLURM profile (``set-resources``; ``default-resources``): a
    path, or :func:`read_profile`'s merge of several."""
    data = _profile(profile)
    default = _number((data.get("default-resources") or {}).get("runtime"))
    out = {
        rule: _number(res["runtime"])
        for rule, res in (data.get("set-resources") or {}).items()
        if hasattr(res, "get") and _number(res.get("runtime")) is not None
    }
    if default is not None:
        out["*"] = default
    return out


ROW_RULES = {"evaluate": ("evaluate", "evaluate_base")}  # a row's jobs, by rule: the base model's evaluations too


def check_runtimes(rows: list[Row], runtimes: dict[str, float], overrides: dict | None = None) -> list[str]:
    """A warning per rule whose estimated wall time per job, times ``runtime_margin`` (the estimate's error),
    exceeds its SLURM ``runtime`` (the ``evaluate`` row: rules evaluate and evaluate_base, the shorter limit),
    naming the key it comes from (``"*"``: default-resources)."""
    margin = assumptions(overrides)["runtime_margin"]
    warnings = []
    for r in rows:
        limits = []
        for rule in ROW_RULES.get(r.rule, (r.rule,)):
            if rule in runtimes:
                limits.append((runtimes[rule], f"set-resources.{rule}.runtime"))
            elif "*" in runtimes:
                limits.append((runtimes["*"], f"default-resources.runtime, rule {rule}"))
        short = [(limit, key) for limit, key in limits if r.wall_h * margin * 60 > limit]
        if short:
            limit, key = min(short)
            warnings.append(
                f"WARNING {r.rule}: a job needs ~{r.wall_h:.1f} h (x{margin:g} margin: {r.wall_h * margin:.1f} h), "
                f"its SLURM runtime is {limit / 60:.1f} h ({key}): it could be killed"
            )
    return warnings


def slurm_gpus(profile: str | Path | dict) -> dict[str, int]:
    """``gpu`` per rule in a Snakemake SLURM profile's ``set-resources`` (a path, or :func:`read_profile`'s merge)."""
    data = _profile(profile)
    return {
        rule: int(_number(res["gpu"]) or 0)
        for rule, res in (data.get("set-resources") or {}).items()
        if hasattr(res, "get") and _number(res.get("gpu")) is not None
    }


def check_gpus(config: dict, gpus: dict[str, int]) -> list[str]:
    """A warning per vLLM rule whose SLURM ``gpu`` is fewer than its engines need (grid.eval
    ``data_parallel_size`` x ``tensor_parallel_size``): the job would fail when its engines start."""
    need = _eval_gpus(config)
    return [
        f"WARNING {rule}: grid.eval asks for {need} GPUs (data_parallel_size x tensor_parallel_size), the "
        f"profile gives {gpus[rule]} (set-resources.{rule}.gpu)"
        for rule in ("evaluate", "rank_train")
        if rule in gpus and gpus[rule] < need
    ]


def render(
    rows: list[Row], trains: list[Row], overrides: dict | None = None, brief: bool = False, gpus: int = 8
) -> str:
    """The plan as text: per rule, per training run, totals (and the wall time on ``gpus`` GPUs), then the
    assumptions with their sources (``brief``: the rules and totals only)."""
    a = assumptions(overrides)
    lines = [f"{'rule':<16}{'jobs':>6}{'GPUs/job':>10}{'wall h/job':>12}{'GPU-h':>12}{'disk GB':>10}  note"]
    for r in rows:
        lines.append(
            f"{r.rule:<16}{r.jobs:>6}{r.gpus:>10g}{r.wall_h:>12.2f}{r.gpu_hours:>12.1f}{r.disk_gb:>10.1f}  {r.note}"
        )
    t = totals(rows, trains, gpus)
    lines.append(
        f"{'total':<16}{'':>6}{'':>10}{t['critical_path_h']:>12.1f}{t['gpu_hours']:>12.1f}"
        f"{t['disk_gb']:>10.1f}  wall: rules in sequence, unlimited GPUs (upper bound)"
    )
    lines.append(
        f"on {gpus} GPUs: at least {t['on_gpus_h']:.1f} h (the path above, or the {t['held_gpu_hours']:.1f} GPU-hours "
        f"the jobs hold spread over them)"
    )
    packed = [f"{r.rule} {r.per_node}" for r in rows if r.gpus and r.per_node]
    node = f"{a['node_gpus']:g} GPUs, {a['node_cpus']:g} CPUs, {a['node_mem_mb'] / 1000:g} GB"
    lines.append(f"jobs per node ({node}; --assume node_gpus/node_cpus/node_mem_mb): " + ", ".join(packed))
    if brief:
        return "\n".join(lines)
    lines += ["", "training runs:"] + [
        f"  {tr.wall_h:7.1f} h  {tr.gpu_hours:7.0f} GPU-h  {tr.disk_gb:7.1f} GB  {tr.note}" for tr in trains
    ]
    lines += ["", "assumptions (override: --assume name=value):"]
    for key, (value, source) in ASSUMPTIONS.items():
        lines.append(f"  {key} = {a[key]:g}  ({source})" if a[key] != value else f"  {key} = {value}  ({source})")
    lines += [f"  {k} = {v:g}  (given)" for k, v in a.items() if k.startswith("gen_tokens_per_s.")]
    return "\n".join(lines)


def parse_assume(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--assume {item!r}: expected name=value")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--assume {item!r}: {value!r} is not a number") from None
        if not math.isfinite(out[key.strip()]):
            raise ValueError(f"--assume {item!r}: not a finite number")
    return out
