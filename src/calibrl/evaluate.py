"""Evaluate one checkpoint: n samples per problem on every evaluation split, graded, AVG@k and PASS@k.

AVG@k is the mean fraction of correct samples per problem; PASS@k the unbiased pass@k estimator
(equal to "any of the k correct" when n == k). For the synthetic task the number of distinct correct
answers per problem (out of n samples) measures how many solution modes the policy still produces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from calibrl.grading import summarize
from calibrl.logs import Progress
from calibrl.sampling import sample
from calibrl.tasks import format_prompt

log = logging.getLogger("calibrl.evaluate")


def evaluate_policy(
    policy,
    tokenizer,
    splits: dict[str, list[dict]],
    grade: Callable,
    n: int,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    template: str,
    prompts_per_batch: int = 64,
    seed: int = 0,
) -> dict:
    """``grade(responses, records) -> list[Grade]``; returns per-split metrics (fractions in [0, 1])."""
    generator = torch.Generator().manual_seed(seed)
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
                [format_prompt(r, template) for r in chunk],
                n,
                max_new_tokens,
                temperature,
                top_p,
                generator=generator,
            )
            grades = grade(roll.texts, [r for r in chunk for _ in range(n)])
            lengths += roll.response_mask.sum(-1).tolist()
            groups += [grades[i * n : (i + 1) * n] for i in range(len(chunk))]
            progress.update(note=name)
        results[name] = split_metrics(groups, lengths, k)
        log.info("%s: %s", name, results[name])
    return results


def split_metrics(grades: Sequence[Sequence], lengths: Sequence[int], k: int) -> dict:
    """One split's result from each problem's n grades (``calibrl.grading.Grade``) and the response lengths:
    AVG@k, PASS@k, distinct correct answers per problem, timeouts; the layout every evaluator writes."""
    summary = summarize([[g.correct for g in group] for group in grades], k)
    distinct = [len({g.extracted for g in group if g.correct}) for group in grades]
    return {
        f"avg_at_{k}": summary["avg_at_k"],
        f"pass_at_{k}": summary["pass_at_k"],
        "distinct_correct": sum(distinct) / max(len(distinct), 1),
        "n_problems": summary["n_problems"],
        "n_samples": len(grades[0]) if grades else 0,
        "timeouts": sum(g.timed_out for group in grades for g in group),
        "response_length": sum(lengths) / max(len(lengths), 1),
    }
