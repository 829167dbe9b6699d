"""What a grid costs before anything is submitted: GPU-hours, wall time and disk per rule and in total.

``calibrl plan --configfile config/paper.yaml`` prints the estimate; ``check_runtimes`` compares each job's
wall time with the SLURM profile's ``runtime`` (read only) and warns where a job would be killed.

The estimate is a stated throughput model, not a measurement. The model is ``calibrl.cost`` (re-exported here:
``calibrl.plan.ASSUMPTIONS`` is ``calibrl.cost.ASSUMPTIONS``). Every number it uses is in ``ASSUMPTIONS``, each with
where it comes from; any of them is overridden with ``--assume key=value`` (or a YAML file of such keys,
``--assumptions FILE``). Model sizes come from the Qwen3 configs (``calibrl.cost.QWEN3``: the fields of each model's
``config.json`` on the Hub) or a downloaded folder's ``config.json``, so parameter counts, checkpoint bytes and
KV-cache bytes are computed, not assumed.

Throughput model (per GPU, bf16; the formulas in ``calibrl.cost``):

* generation (vLLM, large batches, decode-dominated): each output token costs the weight matmuls,
  ``2 N`` FLOPs at ``gen_mfu`` of peak, plus reading its sequence's KV cache, ``kv_bytes_per_token(model) x
  mean context`` at ``gen_kv_efficiency`` of HBM bandwidth; tokens/s = 1 / (compute time + KV time).
  Prompt tokens are prefilled at ``train_mfu`` of peak (2 N FLOPs each). ``--assume gen_tokens_per_s.<hf_id>=X``
  replaces the formula for a model by a measured figure.
* training (each GPU backend prices its runs, ``GpuSide.train_cost``; OpenRLHF's, ``backends/openrlhf/cost.py``,
  with DeepSpeed): ``train_flops_per_param_token x N`` FLOPs per (prompt + response) token at
  ``train_mfu`` of peak on the actor GPUs (fwd + bwd 6N, activation recomputation 2N, the old-policy
  forward 2N, the reference forward 2N).
* generation ends with its long tail: the longest response (at the budget) finishes alone, each token reading
  the engine's weights from HBM (``tail_seconds``);
* generation runs in waves (``generation_waves``) where an engine's share of the batch (sequences x their length)
  exceeds its KV cache (``kv_capacity_tokens``: its memory share of ``gpu_memory_gb`` less ``vllm_non_kv_gb`` and
  the weights; DLC's composite holds two models' weights and KV); each wave adds a long tail, and the preempted
  sequences are prefilled again;
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

from calibrl import cost as C
from calibrl import grid as G
from calibrl.cost import (  # noqa: F401 (the planner's model, re-exported: calibrl.plan.QWEN3 and the rest)
    ASSUMPTIONS,
    HEAD_DIM,
    QWEN3,
    VOCAB,
    RunPlan,
    assumptions,
    gen_tokens_per_s,
    generation_seconds,
    generation_waves,
    kv_bytes_per_token,
    kv_capacity_tokens,
    memory_update_seconds,
    parameters,
    shape_parameters,
    startup_seconds,
    tail_seconds,
)


def learn(config: dict) -> None:
    """Learn the shape of each model of the grid that ``QWEN3`` does not list from its downloaded folder's
    config.json, where that folder exists (a model downloaded before the plan, or the CPU rehearsal's tiny ones)."""
    import json

    for model in G.run_models(config):
        folder = Path(G.model_path(config, model)) / "config.json"
        if folder.is_file():
            C.learn_shape(_hf(config, model), json.loads(folder.read_text()))


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
    """One training run, as its backend's GPU side prices it (``GpuSide.train_cost``: its layout, its method's
    extra work); ``jobs`` is its number of segments, ``wall_h`` the longest segment's hours (one SLURM job); packed
    onto nodes with the ``request`` of rule train (:func:`fit`)."""
    grid = config["grid"]
    spec = G.method(config, run.method)
    memory = G.memory_of(grid, run.model) if spec.uses_dlc else None
    run_plan = RunPlan(
        path=run.path,
        train=grid["train"],
        spec=spec,
        layout=G.resources(config, run),
        model=_hf(config, run.model),
        memory=_hf(config, memory) if memory else None,
        ends=tuple(G.segment_ends(config, run)),
        checkpoints=len(G.eval_steps(config)),
        retention=G.retention(config),
    )
    gpu = G.backend(config).gpu
    if gpu is None:
        trainer = config["grid"]["trainer"]
        raise ValueError(f"trainer {trainer} trains on this machine's CPUs: the cluster planner prices GPU backends")
    c = gpu.train_cost(run_plan, a)
    row = Row("train", c.jobs, c.gpus, c.run_h, _gb(c.disk_bytes), c.note, c.run_h * c.gpus, c.segment_h)
    return _pack(row, a, c.nodes, c.gpus_per_node, request)


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
