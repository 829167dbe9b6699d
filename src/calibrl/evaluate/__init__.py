"""Evaluating checkpoints: n samples per problem on every evaluation split, graded by math-verify, AVG@k, PASS@k and
distinct correct answers per problem (``calibrl.metrics.split_metrics``).

An evaluator is a module here (its name is ``grid.eval``'s ``evaluator``) with
``evaluate_checkpoint(policy_dir, splits, grade, settings)``: ``local`` samples with the CPU sampler of
``calibrl.sampling``, ``vllm`` puts every split into vLLM engines (and ranks the filtering baseline's training
queries). :func:`evaluate_job` is what rule evaluate (and a training job that evaluates its own checkpoints) runs.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path

from calibrl import checkpoints
from calibrl.io import write_json
from calibrl.spec import EvalSettings

log = logging.getLogger("calibrl.evaluate")

# Per evaluator: the grid.eval keys it never reads (set, they are refused), whether its engines take GPUs, the
# conda environment of its jobs (``--sdm conda``, relative to the workflow's rules), and whether its jobs also
# measure each correct mode's probability (``calibrl.modes``, Definition 2.1) on tasks that list their modes.
EVALUATORS = {
    "local": {
        "ignored": {
            f"eval.{k}": "an engine setting of evaluator vllm"
            for k in ("dtype", "enforce_eager", "data_parallel_size", "tensor_parallel_size")
        },
        "gpus": False,
        "env": "../../envs/local.yaml",
        "modes": True,  # the checkpoint is a model of calibrl.models, teacher-forced on CPU
        "preload": (f"{__name__}.local",),  # its jobs run in the local job server (calibrl.jobserver)
    },
    "vllm": {
        "ignored": {},
        "gpus": True,
        "env": "../../envs/cluster-eval.yaml",
        "modes": False,
        "preload": (),
    },
}


def names() -> list[str]:
    return sorted(EVALUATORS)


def ignored(name: str) -> dict[str, str]:
    return EVALUATORS[name]["ignored"]


def env(name: str) -> str:
    return EVALUATORS[name]["env"]


def measures_modes(name: str) -> bool:
    return EVALUATORS[name]["modes"]


def preload(name: str) -> tuple[str, ...]:
    """The modules evaluator ``name``'s jobs import, for the local job server to import once."""
    return EVALUATORS[name]["preload"]


def request(grid: dict) -> dict:
    """What an evaluation (or ranking) job asks SLURM for: one node with the GPUs of its engines (``grid.eval``
    ``data_parallel_size`` x ``tensor_parallel_size``); nothing for the CPU evaluator."""
    ev = grid["eval"]
    if not EVALUATORS[grid["evaluator"]]["gpus"]:
        return {}
    return {"nodes": 1, "gres": f"gpu:{int(ev['data_parallel_size']) * int(ev['tensor_parallel_size'])}"}


def evaluate_checkpoint(settings: EvalSettings, policy_dir: str, splits: dict[str, list[dict]], grade: Callable):
    """One checkpoint on every split, with the evaluator ``settings`` names."""
    module = importlib.import_module(f"{__name__}.{settings.evaluator}")
    return module.evaluate_checkpoint(policy_dir, splits, grade, settings)


def evaluate_job(
    params: dict,
    settings_path: str,
    markers: list[str],
    split_paths: dict[str, str],
    out_paths: list[str],
    steps: list[int],
    threads: int = 1,
    workers: int = 1,
    release: Callable[[str, int], bool] | None = None,
) -> None:
    """Evaluate each checkpoint (``markers[i]`` -> ``out_paths[i]``, step ``steps[i]``; ``params``:
    ``grid.eval_params``), after checking it was trained with the run's current settings (``settings_path``).

    The splits are read once and one set of grading workers serves every checkpoint; each result is the one the
    checkpoint gets when evaluated alone (sampling is seeded per checkpoint, with the run seed's stream:
    ``EvalSettings.for_seed``). ``release(policy_dir, step)``, when given, is called once a result is written (the
    backend's ``release`` under ``grid.retention``)."""
    if not len(markers) == len(out_paths) == len(steps):
        raise ValueError(f"{len(markers)} markers, {len(out_paths)} outputs and {len(steps)} steps")
    stamp = checkpoints.RunStamp.read(settings_path)
    ckpts = [checkpoints.check_marker(m, stamp.fingerprint) for m in markers]  # all, before any work
    for ckpt in ckpts:
        if not Path(ckpt["policy"]).is_dir():
            raise FileNotFoundError(
                f"{ckpt['policy']}: the checkpoint of step {ckpt['step']} is gone, removed after its evaluation "
                "(grid.retention.remove_evaluated) or by hand. To evaluate it again, add its step to "
                "grid.retention.keep_steps and retrain the run (snakemake --forcerun train)."
            )
    items = [
        ({"step": step, "policy": c["policy"], "fingerprint": c["fingerprint"]}, out)
        for c, out, step in zip(ckpts, out_paths, steps)
    ]
    _evaluate(params, stamp.seed, stamp.settings.get("plan"), items, split_paths, threads, workers, release)


def evaluate_base_job(
    params: dict, model_info: str, split_paths: dict[str, str], out_path: str, threads: int = 1, workers: int = 1
) -> None:
    """Rule evaluate_base's job (``params``: ``grid.base_params``): the model every run starts from (``model_info``
    names its folder), as step 0, with training seed ``params["seed"]``'s sampling stream, so each seed's runs are
    compared with the base on its samples."""
    policy = checkpoints.model_dir(model_info)
    items = [({"step": 0, "policy": policy, "fingerprint": checkpoints.digest(model_info)}, out_path)]
    _evaluate(params, params["seed"], params["plan"], items, split_paths, threads, workers, None)


def _evaluate(params, seed, plan, items, split_paths, threads, workers, release) -> None:
    import torch

    from calibrl.data.records import read_jsonl
    from calibrl.tasks import Scorer

    settings = EvalSettings.from_params(params["settings"]).for_seed(seed)
    torch.set_num_threads(max(1, int(threads)))  # Snakemake runs jobs side by side
    splits = {name: read_jsonl(path, on_error=params["on_error"]) for name, path in split_paths.items()}
    with Scorer(workers=workers) as scorer:
        for record, out_path in items:
            log.info("checkpoint step %d: %s", record["step"], record["policy"])
            results = evaluate_checkpoint(settings, record["policy"], splits, scorer.grades)
            if "modes" in params:  # grid.eval_params sets it where the modes are measured
                _add_modes(results, record["policy"], splits, settings.template)
            write_json(out_path, {**record, "seed": seed, "plan": plan, "sampling": settings.to_dict(),
                                  "splits": results})  # fmt: skip
            if release is not None:
                release(record["policy"], record["step"])


def _add_modes(results: dict, policy_dir: str, splits: dict[str, list[dict]], template: str) -> None:
    """Each problem's correct modes with their log-probabilities (``per_problem.modes``, ``calibrl.modes``)."""
    from calibrl import modes
    from calibrl.models import load

    model, tokenizer = load(policy_dir)  # in eval mode
    for name, records in splits.items():
        if not modes.measurable(records):
            log.info("%s: its records do not list their correct modes; Definition 2.1 is not measured", name)
            continue
        results[name]["per_problem"]["modes"] = modes.mode_logprobs(model, tokenizer, records, template)
