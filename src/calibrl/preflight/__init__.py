"""The preflight: what a site's first GPU jobs would die of, found in minutes and named with its fix.

Rule ``preflight`` runs one job per request shape of the grid's GPU jobs (a training layout's nodes x GPUs, the
evaluator's one node with its engines' GPUs), on the GPU partition, in the jobs' own environment
(``calibrl.offline``, the GPU venv), and every GPU job of that shape waits for it (workflow/rules/preflight.smk).
It runs every check that the shape's jobs need (``checks``: the common ones of :data:`CHECKS` and, for training
shapes, the backend's own, ``GpuSide.preflight_checks``), reports each as pass, fail or
waived with what it saw, and fails the job, naming each cause and fix, if any check not in
``grid.preflight.waive`` failed; its output ``preflight/<shape>.json`` is written only when all passed.

Its params (:func:`params`) are what those checks read, derived from the grid: the vLLM engines to start
(:func:`engines`: the evaluator's for evaluation shapes; for training shapes the rollout engine each kind of run
starts, as its backend describes it: ``GpuSide.rollout_engine``), the nodes and GPUs the Ray check spans, the
models, the results folder and the planner's disk estimate.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from pathlib import Path

from calibrl import backends, evaluate, offline
from calibrl import grid as G
from calibrl import plan as P
from calibrl.io import write_json
from calibrl.preflight import checks as C

log = logging.getLogger("calibrl.preflight")

# name: (check, the jobs that need it: "train" for training layouts, "engines" for evaluation and ranking); the
# schema's $defs/preflight_check lists these, and the config's enum adds every backend's own
CHECKS = {
    "gpus": (C.gpus, {"train", "engines"}),
    "driver": (C.driver, {"train", "engines"}),
    "compiler": (C.compiler, {"train", "engines"}),
    "models": (C.models, {"train", "engines"}),
    "disk": (C.disk, {"train", "engines"}),
    "lock": (C.lock, {"train"}),
    "vllm": (C.vllm_engine, {"train", "engines"}),
    "ray": (C.ray, {"train"}),
}
BACKEND_BEFORE = "vllm"  # a backend's checks (its stack) run before the engines and Ray, which need that stack
BACKEND_LAST = ("canary",)  # ... except a training canary, which needs all of it and takes longest
NOT_RUN_WAIVED = ("canary",)  # a waived check still runs and is reported, except a training run


def all_checks(trainer: str) -> dict:
    """:data:`CHECKS` with backend ``trainer``'s own training checks, in the order they run."""
    gpu = backends.get(trainer).gpu  # a CPU backend has no GPU jobs, hence no checks of its own
    own = {name: (check, {"train"}) for name, check in (gpu.preflight_checks() if gpu else {}).items()}
    first = {k: v for k, v in own.items() if k not in BACKEND_LAST}
    out: dict = {}
    for name, entry in CHECKS.items():
        out.update(first if name == BACKEND_BEFORE else {})
        out[name] = entry
    return out | {k: v for k, v in own.items() if k in BACKEND_LAST}


class PreflightFailed(RuntimeError):
    """At least one check that is not waived failed."""


def shape_name(request: dict) -> str:
    """``n<nodes>-<gres without colons>``: ``{"nodes": 2, "gres": "gpu:8"}`` -> ``n2-gpu8``."""
    return f"n{int(request['nodes'])}-{request['gres'].replace(':', '')}"


def shapes(config: dict) -> dict[str, dict]:
    """Every request shape of the grid's GPU jobs, with the kinds of job that use it ({} on CPU backends)."""
    out: dict[str, dict] = {}

    def add(request: dict, kind: str) -> None:
        if request:
            entry = out.setdefault(shape_name(request), {**request, "jobs": set()})
            entry["jobs"].add(kind)

    for run in G.runs(config):
        add(G.request(config, run), "train")
    add(evaluate.request(config["grid"]), "engines")
    return out


def params(config: dict, shape: str) -> dict:
    """What the preflight job of ``shape`` reads: its request, its checks, the models, the vLLM engines to start
    (:func:`engines`), the results folder and the planner's disk estimate."""
    grid = config["grid"]
    entry = shapes(config)[shape]
    models = [G.download_params(config, m) for m in G.run_models(config)]
    P.learn(config)  # the shapes of models the planner's table lacks, from their downloaded folders
    return {
        "shape": shape,
        "nodes": int(entry["nodes"]),
        "gpus_per_node": int(entry["gres"].rsplit(":", 1)[1]),
        "backend": grid["trainer"],
        "checks": [name for name, (_, jobs) in all_checks(grid["trainer"]).items() if jobs & entry["jobs"]],
        "waive": list(grid["preflight"]["waive"]),
        "models": models,
        "engines": engines(config, shape),
        "canary": canaries(config, shape) if _canary_runs(config, entry) else [],
        "workers": int(grid["workers"]),
        "results": str(Path(config["results"]).resolve()),
        "disk_gb": round(P.totals(*P.plan(config))["disk_gb"], 1),
    }


def engines(config: dict, shape: str) -> list[dict]:
    """The vLLM engines the ``vllm`` check of ``shape`` starts: the evaluator's where evaluation or ranking jobs use
    the shape, and :func:`training_engines` where training jobs do."""
    entry = shapes(config)[shape]
    out = [evaluator_engine(config)] if "engines" in entry["jobs"] else []
    return out + (training_engines(config, shape) if "train" in entry["jobs"] else [])


def evaluator_engine(config: dict) -> dict:
    """The evaluator's engine (``calibrl.evaluate.vllm.engine_kwargs``) on the smallest model of the grid (it starts
    fastest), with the evaluation's dtype, eagerness and tensor-parallel size."""
    ev = config["grid"]["eval"]
    smallest = min(G.run_models(config), key=lambda m: P.parameters(G.download_params(config, m)["hf_id"]))
    return {
        "role": "evaluation",
        "model": G.model_path(config, smallest),
        "dtype": ev["dtype"],
        "enforce_eager": ev["enforce_eager"],
        "tensor_parallel_size": int(ev["tensor_parallel_size"]),
        "max_model_len": 512,
    }


def training_engines(config: dict, shape: str) -> list[dict]:
    """The rollout engines of the training runs of ``shape``, started by the ``vllm`` check as their backend starts
    them (``GpuSide.rollout_engine``, ``engine_probe``): one per kind (tensor-parallel size, sleep mode, DLC's
    memory and mu), each on the smallest policy among the runs of that kind, with its run's layout. A plain kind is left
    out where a DLC kind of the same size and sleep mode is started: DLC's engine runs OpenRLHF's worker extension
    (``DLCWorkerWrap`` is a ``WorkerWrap``) and vLLM's Qwen3 as its policy stack, and more."""
    gpu = G.backend(config).gpu
    if gpu is None:  # a CPU backend's runs have no request, hence no shape
        return []
    grid, train = config["grid"], config["grid"]["train"]
    kinds: dict[tuple, list[dict]] = {}  # (TP, sleep, DLC) -> the engine of every run of that kind
    for run, spec in G.run_specs(config):
        if shape_name(G.request(config, run)) != shape:
            continue
        memory = G.model_path(config, G.memory_of(grid, run.model)) if spec.uses_dlc else None
        engine = gpu.rollout_engine(train, spec, G.resources(config, run), G.model_path(config, run.model), memory)
        if engine is None:  # the backend starts no engine
            continue
        engine = {"role": "training", **engine, "runs_of": run.model}  # the keys in the order they always had
        tp, sleep, dlc = engine["tensor_parallel_size"], engine["sleep"], engine["dlc"]
        kinds.setdefault((tp, sleep, dlc is not None, json.dumps(dlc, sort_keys=True)), []).append(engine)
    with_dlc = {(tp, sleep) for tp, sleep, dlc, _ in kinds if dlc}
    out = []
    for (tp, sleep, dlc, _), group in kinds.items():
        if not dlc and (tp, sleep) in with_dlc:
            continue  # the DLC engine of this size and sleep mode checks what this one would
        engine = min(group, key=lambda e: P.parameters(_hf_id(config, e["runs_of"])))
        covered = group + [e for (t, s, d, _), g in kinds.items() if dlc and not d and (t, s) == (tp, sleep) for e in g]
        out.append({**engine, "runs_of": sorted({e["runs_of"] for e in covered})})
    return out


CANARY_STEPS = (2, 3)  # the canary's segments: 2 steps and a save, then a resume for a third


def canary_kind(spec) -> str:
    """The canary's kinds of training run: what starts different roles and patches (DLC's memory and composite
    engine; DAPO's dynamic sampling without a reference model; the rest with a reference KL)."""
    return "dlc" if spec.uses_dlc else "dapo" if spec.dynamic_sampling else "plain"


def canaries(config: dict, shape: str) -> list[dict]:
    """The training canary's runs for ``shape`` (the backend's check ``canary``): one per :func:`canary_kind` among
    the shape's runs, on the smallest policy of that kind (an IAC method first: one more patch), with the run's
    compiled method, batch and layout unchanged and only its length cut: :data:`CANARY_STEPS`, a checkpoint at the
    first segment's end, and responses of at most ``grid.preflight.canary.max_new_tokens``. Each is ``{kind, run,
    settings, resources, inputs}``, ``settings`` as ``grid.train_params`` gives a run's, ``inputs`` relative to the
    results folder."""
    grid = config["grid"]
    picked: dict[str, tuple] = {}
    for i, (run, spec) in enumerate(G.run_specs(config)):
        if spec.filters or shape_name(G.request(config, run)) != shape:
            continue  # the filtering baseline trains as GRPO does, from a ranking made by a job of its own
        key = (P.parameters(_hf_id(config, run.model)), not spec.iac_alpha, i)
        kind = canary_kind(spec)
        if kind not in picked or key < picked[kind][0]:
            picked[kind] = (key, run)
    out = []
    for kind in ("plain", "dapo", "dlc"):
        if kind not in picked:
            continue
        run = picked[kind][1]
        settings = G.train_params(config, run)
        train = {**settings["train"], "steps": CANARY_STEPS[-1], "eval_every": CANARY_STEPS[0]}
        train["max_new_tokens"] = min(int(train["max_new_tokens"]), int(grid["preflight"]["canary"]["max_new_tokens"]))
        settings = {**settings, "run": f"preflight-canary/{shape}/{kind}", "train": train}
        out.append({"kind": kind, "run": run.path, "settings": settings, "resources": G.resources(config, run),
                    "inputs": G.inputs(config, run)})  # fmt: skip
    return out


def inputs(config: dict, shape: str) -> list[str]:
    """The files the preflight job of ``shape`` reads beyond the models: the inputs of every run the canary may
    train (which one it picks needs the downloaded models' sizes: the job's params, not the DAG, know them)."""
    entry = shapes(config).get(shape)
    if entry is None or not _canary_runs(config, entry):
        return []
    found = {
        path
        for run, spec in G.run_specs(config)
        if not spec.filters and shape_name(G.request(config, run)) == shape
        for path in G.inputs(config, run).values()
    }
    return sorted(found)


def _canary_runs(config: dict, entry: dict) -> bool:
    """Whether the canary trains on a shape: its jobs train, its backend has the check, and it is not waived (a
    waived canary is not run: it is the one check that costs a training run)."""
    grid = config["grid"]
    return (
        "train" in entry["jobs"]
        and "canary" in all_checks(grid["trainer"])
        and "canary" not in grid["preflight"]["waive"]
    )


def _hf_id(config: dict, model: str) -> str:
    return G.download_params(config, model)["hf_id"]


def run_checks(p: dict) -> list[dict]:
    """Every check of ``p["checks"]``, in order, each with its status, what it saw, the fix and its seconds."""
    out, known = [], all_checks(p["backend"])
    for name in p["checks"]:
        check, _ = known[name]
        start = time.monotonic()
        if name in NOT_RUN_WAIVED and name in p["waive"]:
            out.append({"check": name, "status": "waived", "detail": "not run (grid.preflight.waive)", "fix": "",
                        "seconds": 0.0})  # fmt: skip
            log.info("%-10s %-6s not run", name, "waived")
            continue
        try:
            row = {"check": name, "status": "pass", "detail": check(p), "fix": ""}
        except C.Failed as f:
            row = {"check": name, "status": "fail", "detail": f.cause, "fix": f.fix}
        except Exception as exc:  # an unforeseen failure is still this check's
            log.error("%s: %s", name, traceback.format_exc())
            row = {"check": name, "status": "fail", "detail": f"{type(exc).__name__}: {exc}", "fix": "see the log"}
        if row["status"] == "fail" and name in p["waive"]:
            row["status"] = "waived"
        row["seconds"] = round(time.monotonic() - start, 1)
        log.info("%-10s %-6s %s%s", name, row["status"], row["detail"], f"  FIX: {row['fix']}" if row["fix"] else "")
        out.append(row)
    return out


def preflight_job(p: dict, out_path: str) -> None:
    """Rule preflight's job: run the checks; write ``out_path`` if none failed, else raise naming each failure
    (the rows are kept beside it, ``<out>.failed.json``)."""
    offline.apply()
    rows = run_checks(p)
    report = {"shape": p["shape"], "checks": rows}
    failed = [r for r in rows if r["status"] == "fail"]
    kept = Path(f"{out_path}.failed.json")
    if failed:
        write_json(kept, report)
        lines = [f"  {r['check']}: {r['detail']}\n    fix: {r['fix']}" for r in failed]
        raise PreflightFailed(
            f"preflight {p['shape']}: {len(failed)} of {len(rows)} checks failed (grid.preflight.waive accepts a "
            f"failure knowingly):\n" + "\n".join(lines)
        )
    kept.unlink(missing_ok=True)
    write_json(out_path, report)
