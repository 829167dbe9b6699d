"""The paper's claims about Tables 2-5 and Figure 6, each decided on a quantity fixed in advance.

The quantity (``grid.claims``): per problem, AVG@k (correct samples / n) or PASS@k (the unbiased estimator),
at each of the last ``grid.claims.last_checkpoints`` evaluated checkpoints, averaged over them; then the mean
over each split's problems, and the mean over the evaluation splits (the paper's "Avg.": the mean of its
benchmarks). Not the peak over checkpoints: choosing the best checkpoint per cell is selection on the test set
(the peak tables stay, as the paper's reporting). Figure 6's quantity is the training entropy averaged over the
last quarter of the steps, per seed. Every claim is a contrast between arms on their common seeds
(``calibrl.report.stats``); the toy's claims join the same Holm family (``calibrl.toy.verdicts``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibrl import stats as S
from calibrl.metrics import pass_at_k
from calibrl.report.load import metrics

COLUMNS = ["claim", "source", "quantity", "estimate", "ci_low", "ci_high", "seeds", "p", "p_holm", "verdict"]


@dataclass(frozen=True)
class Claim:
    """``kind``: "diff" (arms[0] above arms[1]), "best" (arms[0] above every other arm), "interior" (the best
    of ``arms[:2]`` above the best of ``arms[2:]``). ``metric``: a key of the evaluation files, or "entropy"."""

    claim: str
    source: str
    model: str
    metric: str
    kind: str
    arms: tuple[str, ...]

    def contrast(self, m: dict[str, np.ndarray]) -> np.ndarray:
        a = self.arms
        if self.kind == "diff":
            return m[a[0]] - m[a[1]]
        if self.kind == "best":
            return m[a[0]] - np.max([m[o] for o in a[1:]], axis=0)
        if self.kind == "interior":
            return np.max([m[o] for o in a[:2]], axis=0) - np.max([m[o] for o in a[2:]], axis=0)
        raise ValueError(f"unknown claim kind {self.kind!r}")


def paper_claims(grid: dict) -> list[Claim]:
    """Every ordering the paper states about Tables 2-5 and Figure 6, on the arms the config runs.

    A comparison that appears in several tables (IAC vs GRPO is alpha 1 vs 0 in Table 5) is one claim."""
    tables, main = grid["tables"], grid["main_model"]
    out: list[Claim] = []
    for key, label in metrics(grid).items():
        t23 = tables["table2_3"]
        for model in grid["models"]:
            for base in [m for m in t23 if m != "iac"]:
                src = "table2/3" + ("/5 (alpha 1 vs 0)" if base == "grpo" and model == main else "")
                out.append(Claim(f"IAC above {base} ({label}, {model})", src, model, key, "diff", ("iac", base)))
            if len(t23) > 2:
                others = tuple(m for m in t23 if m != "iac")
                out.append(
                    Claim(f"IAC best of Table 2/3 ({label}, {model})", "table2/3", model, key, "best", ("iac", *others))
                )
        t4 = tables["table4"]
        if "dapo_iac_dlc" in t4 and len(t4) > 1:
            others = tuple(m for m in t4 if m != "dapo_iac_dlc")
            out.append(
                Claim(f"DAPO+IAC+DLC best in Table 4 ({label})", "table4", main, key, "best", ("dapo_iac_dlc", *others))
            )
        for a, b, text in (
            ("dapo_iac", "dapo", "DAPO+IAC above DAPO"),
            ("iac", "dapo", "IAC alone above DAPO"),
            ("dapo_iac_dlc", "dapo_iac", "DLC adds to DAPO+IAC"),
        ):
            if {a, b} <= set(t4):
                out.append(Claim(f"{text} ({label})", "table4", main, key, "diff", (a, b)))
        t5 = tables["table5"]
        for a, b, text in (("filter", "grpo", "Filtering above GRPO"), ("iac", "filter", "IAC above filtering")):
            if {a, b} <= set(t5):
                out.append(Claim(f"{text} ({label})", "table5", main, key, "diff", (a, b)))
        if {"iac", "iac_a1.5", "grpo", "iac_a2"} <= set(t5):
            out.append(
                Claim(
                    f"alpha optimum interior: best of alpha 1, 1.5 above best of 0, 2 ({label})",
                    "table5",
                    main,
                    key,
                    "interior",
                    ("iac", "iac_a1.5", "grpo", "iac_a2"),
                )
            )
    f6 = tables["figure6"]
    if len(f6) >= 2:  # the paper's Figure 6: DAPO+IAC (the last listed) keeps more entropy than DAPO (the first)
        names = {"dapo": "DAPO", "dapo_iac": "DAPO+IAC", "dapo_iac_dlc": "DAPO+IAC+DLC"}
        a, b = f6[-1], f6[0]
        text = f"Entropy higher under {names.get(a, a)} than {names.get(b, b)} (last quarter of training)"
        out.append(Claim(text, "figure6", main, "entropy", "diff", (a, b)))
    return out


def problem_quantity(pp: pd.DataFrame, metric: str, last: int) -> pd.DataFrame:
    """Per (model, method, seed, split, problem): ``metric`` averaged over the ``last`` evaluated checkpoints."""
    if pp.empty:
        return pp.assign(q=[])
    steps = sorted(pp["step"].unique())[-last:]
    sub = pp[pp["step"].isin(steps)]
    if metric.startswith("pass_at_"):
        k = int(metric.rsplit("_", 1)[1])
        q = [pass_at_k(n, c, k) for n, c in zip(sub["n"], sub["correct"])]
    else:  # avg_at_k: the fraction of correct samples
        q = sub["correct"] / sub["n"]
    sub = sub.assign(q=np.asarray(q, dtype=float))
    return sub.groupby(["model", "method", "seed", "split", "problem"], as_index=False)["q"].mean()


def sample_of(q: pd.DataFrame, model: str, arms: tuple[str, ...]) -> S.Sample | None:
    """The arms' (seeds x problems) arrays on the seeds every arm has; None when an arm is missing."""
    sub = q[(q["model"] == model) & q["method"].isin(arms)]
    seeds = sorted(set.intersection(*(set(sub[sub["method"] == a]["seed"]) for a in arms))) if len(sub) else []
    if not seeds:
        return None
    sub = sub[sub["seed"].isin(seeds)]
    wide = sub.pivot_table(index=["method", "seed"], columns=["split", "problem"], values="q")
    if wide.isna().any().any():
        raise ValueError(f"arms {arms} of {model} were not evaluated on the same problems")
    splits = wide.columns.get_level_values("split")
    per_split = pd.Series(splits).map(pd.Series(splits).value_counts()).to_numpy()
    weights = 1.0 / (per_split * len(set(splits)))
    values = {a: wide.loc[a].loc[seeds].to_numpy() for a in arms}
    return S.Sample(values, weights, np.asarray(pd.factorize(splits)[0]), seeds)


def entropy_quantity(train: pd.DataFrame) -> pd.DataFrame:
    """Per (model, method, seed): training entropy averaged over the last quarter of the steps (Figure 6)."""
    if train.empty or "entropy" not in train:
        return pd.DataFrame(columns=["model", "method", "seed", "split", "problem", "q"])
    last = train[train["step"] > train["step"].max() * 0.75]
    out = last.groupby(["model", "method", "seed"], as_index=False)["entropy"].mean()
    return out.rename(columns={"entropy": "q"}).assign(split="train", problem=0)


def decide(claims: list[Claim], q_by_metric: dict[str, pd.DataFrame], reps: int = S.REPS) -> pd.DataFrame:
    """One row per claim: estimate (percentage points; nats for entropy), interval, seeds, p, verdict.

    Holm is applied by ``finish`` over the whole family (these claims and the toy's)."""
    rows = []
    for i, c in enumerate(claims):
        sample = sample_of(q_by_metric[c.metric], c.model, c.arms)
        scale = 1.0 if c.metric == "entropy" else 100.0
        quantity = "entropy, last quarter" if c.metric == "entropy" else f"{c.metric}, mean of last checkpoints"
        if sample is None:
            rows.append({"claim": c.claim, "source": c.source, "quantity": quantity, "seeds": 0})
            continue
        e = S.bootstrap(sample, c.contrast, reps=reps, seed=i, linear=c.kind == "diff")
        rows.append(
            {
                "claim": c.claim,
                "source": c.source,
                "quantity": quantity,
                "estimate": e.estimate * scale,
                "ci_low": e.ci_low * scale,
                "ci_high": e.ci_high * scale,
                "seeds": e.seeds,
                "p": e.p,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS[:-2])


def finish(frame: pd.DataFrame) -> pd.DataFrame:
    """Holm across every claim of the frame, then the verdicts (each claim states a positive contrast)."""
    frame = frame.copy()
    frame["p_holm"] = S.holm(frame["p"].astype(float).tolist())
    effects = frame["min_effect"].fillna(0.0) if "min_effect" in frame else [0.0] * len(frame)
    frame["verdict"] = [S.verdict(e, p, 1, m) for e, p, m in zip(frame["estimate"], frame["p_holm"], effects)]
    return frame[COLUMNS + [c for c in frame.columns if c not in COLUMNS]]


def grid_claims(pp: pd.DataFrame, train: pd.DataFrame, grid: dict, reps: int = S.REPS) -> pd.DataFrame:
    """The grid's claims (before Holm), from per-problem evaluation results and training metrics."""
    last = int(grid.get("claims", {}).get("last_checkpoints", 2))
    q = {key: problem_quantity(pp, key, last) for key in metrics(grid)}
    q["entropy"] = entropy_quantity(train)
    return decide(paper_claims(grid), q, reps)


def render(frame: pd.DataFrame) -> list[str]:
    """The claims as a Markdown table, with the counts of each verdict."""
    lines = [
        "| claim | source | estimate | 95% CI | seeds | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in frame.itertuples():
        est = "-" if pd.isna(r.estimate) else f"{r.estimate:+.2f}"
        ci = "-" if pd.isna(r.ci_low) else f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
        p = "-" if pd.isna(r.p_holm) else f"{r.p_holm:.3g}"
        lines.append(f"| {r.claim} | {r.source} | {est} | {ci} | {r.seeds} | {p} | **{r.verdict}** |")
    counts = frame["verdict"].value_counts()
    lines += ["", ", ".join(f"{counts.get(v, 0)} {v}" for v in ("holds", "contradicted", "inconclusive")) + "."]
    return lines
