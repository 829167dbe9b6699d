"""The CPU evaluator: a checkpoint's tiny model sampled with the KV-cache sampler (``calibrl.sampling``), n samples
per problem, batch by batch, graded as they come."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from calibrl.logs import Progress
from calibrl.metrics import split_metrics
from calibrl.sampling import sample
from calibrl.tasks import format_prompt

log = logging.getLogger("calibrl.evaluate.local")


def evaluate_checkpoint(policy_dir: str, splits: dict[str, list[dict]], grade: Callable, settings) -> dict:
    """Every split of one checkpoint (``settings``: ``calibrl.spec.EvalSettings``)."""
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
            with torch.inference_mode():  # nothing sampled here is trained on: no autograd bookkeeping (~3% faster)
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
