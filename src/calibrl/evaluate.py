"""Evaluate checkpoints (rule evaluate's job, ``evaluate_job``): n samples per problem on every evaluation
split, graded, AVG@k and PASS@k.

AVG@k is the mean fraction of correct samples per problem; PASS@k the unbiased pass@k estimator
(equal to "any of the k correct" when n == k). For the synthetic task the number of distinct correct
answers per problem (out of n samples) measures how many solution modes the policy still produces.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.data.records import read_jsonl
from calibrl.io import write_json
from calibrl.logs import Progress
from calibrl.metrics import split_metrics
from calibrl.sampling import sample
from calibrl.tasks import Scorer, format_prompt

log = logging.getLogger("calibrl.evaluate")


def evaluate_checkpoint(settings, policy_dir: str, splits: dict[str, list[dict]], grade: Callable) -> dict:
    """One checkpoint on every split (``settings``: ``calibrl.grid.EvalSettings``): the CPU sampler, or at
    paper scale every split in one vLLM engine (``calibrl.evaluate_vllm``)."""
    if settings.evaluator == "vllm":
        from calibrl.evaluate_vllm import evaluate_checkpoint as on_vllm

        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # checkpoints are local folders; compute nodes are offline
        return on_vllm(policy_dir, splits, grade, settings)
    from calibrl.models import load

    policy, tokenizer = load(policy_dir)
    return evaluate_policy(policy, tokenizer, splits, grade, settings)


def evaluate_policy(
    policy,
    tokenizer,
    splits: dict[str, list[dict]],
    grade: Callable,
    settings,
    prompts_per_batch: int = 64,
) -> dict:
    """``grade(responses, records) -> list[Grade]``; ``settings``: ``calibrl.grid.EvalSettings``. Returns
    per-split metrics (fractions in [0, 1])."""
    s = settings
    n, k = s.n, s.k
    generator = torch.Generator().manual_seed(s.seed)
    total = sum((len(recs) + prompts_per_batch - 1) // prompts_per_batch for recs in splits.values())
    progress = Progress("evaluation batches", total, log, every=10.0)
    results = {}
    for name, records in splits.items():
        groups, lengths = [], []
        for start in range(0, len(records), prompts_per_batch):
            chunk = records[start : start + prompts_per_batch]
            roll = sample(
                policy,
                tokenizer,
                [format_prompt(r, s.template) for r in chunk],
                n,
                s.max_new_tokens,
                s.temperature,
                s.top_p,
                generator=generator,
                top_k=s.top_k,
            )
            grades = grade(roll.texts, [r for r in chunk for _ in range(n)])
            lengths += roll.response_mask.sum(-1).tolist()
            groups += [grades[i * n : (i + 1) * n] for i in range(len(chunk))]
            progress.update(note=name)
        results[name] = split_metrics(groups, lengths, k)
        log.info("%s: %s", name, results[name])
    return results


def evaluate_job(
    params: dict,
    settings_path: str,
    markers: list[str],
    split_paths: dict[str, str],
    out_paths: list[str],
    steps: list[int],
    threads: int = 1,
    workers: int = 1,
    retention: dict | None = None,
) -> None:
    """Evaluate each checkpoint (``markers[i]`` -> ``out_paths[i]``, step ``steps[i]``; ``params``:
    ``grid.eval_params``), after checking it was trained with the run's current settings (``settings_path``).

    The splits are read once and one set of grading workers serves every checkpoint; each result is the
    one the checkpoint gets when evaluated alone (sampling is seeded per checkpoint). ``retention``
    (``grid.retention``): with ``remove_evaluated``, a paper-scale checkpoint is removed once its result is
    written, unless it is the run's newest or one of ``keep_steps`` (``calibrl.checkpoints.release``)."""
    if not len(markers) == len(out_paths) == len(steps):
        raise ValueError(f"{len(markers)} markers, {len(out_paths)} outputs and {len(steps)} steps")
    settings = G.EvalSettings.from_params(params["settings"])
    expected = json.loads(Path(settings_path).read_text())["fingerprint"]
    ckpts = [checkpoints.check_marker(m, expected) for m in markers]  # all, before any work
    for ckpt in ckpts:
        if not Path(ckpt["policy"]).is_dir():
            raise FileNotFoundError(
                f"{ckpt['policy']}: the checkpoint of step {ckpt['step']} is gone, removed after its evaluation "
                "(grid.retention.remove_evaluated) or by hand. To evaluate it again, add its step to "
                "grid.retention.keep_steps and retrain the run (snakemake --forcerun train)."
            )
    torch.set_num_threads(max(1, int(threads)))  # Snakemake runs jobs side by side
    splits = {name: read_jsonl(path, on_error=params["on_error"]) for name, path in split_paths.items()}
    with Scorer(workers=workers) as scorer:
        for ckpt, out_path, step in zip(ckpts, out_paths, steps):
            log.info("checkpoint step %d: %s", step, ckpt["policy"])
            results = evaluate_checkpoint(settings, ckpt["policy"], splits, scorer.grades)
            record = {"step": step, "policy": ckpt["policy"], "fingerprint": ckpt["fingerprint"]}
            write_json(out_path, {**record, "sampling": params["settings"], "splits": results})
            if retention and retention["remove_evaluated"]:
                checkpoints.release(ckpt["policy"], step, retention["keep_steps"])
