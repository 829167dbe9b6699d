"""AVG@k and PASS@k over the n graded samples of each problem (the paper's metrics, Sec. 4.1)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["avg_at_k", "pass_at_k", "split_metrics", "summarize"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), as a stable running product."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"k={k} > n={n}: pass@k needs at least k samples")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_k(correct: Sequence[bool]) -> float:
    """Mean correctness over the n samples of one problem."""
    if len(correct) == 0:
        raise ValueError("avg_at_k of no samples")
    return sum(bool(x) for x in correct) / len(correct)


def summarize(correct_matrix: Sequence[Sequence[bool]], k: int) -> dict:
    """AVG@k and PASS@k averaged over problems (rows of samples), as fractions in [0, 1]."""
    if len(correct_matrix) == 0:
        raise ValueError("summarize of no problems")
    avgs, passes = [], []
    for row in correct_matrix:
        avgs.append(avg_at_k(row))
        passes.append(pass_at_k(len(row), sum(bool(x) for x in row), k))
    return {
        "avg_at_k": sum(avgs) / len(avgs),
        "pass_at_k": sum(passes) / len(passes),
        "n_problems": len(correct_matrix),
    }


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
        # Per problem, in the split's order: what the claims' per-seed quantities and pass@k for every k <= n
        # are computed from (calibrl.report.claims, calibrl.report.sharpening).
        "per_problem": {"correct": [sum(g.correct for g in group) for group in grades], "distinct": distinct},
    }
