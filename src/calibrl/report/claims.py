"""The claims: the plan's primary claims, decided, and the paper's other orderings, reported as exploratory.

Primary claims come from the pre-registered plan (``calibrl.analysis_plan``): each a paired t test (and TOST
against its margin) on the per-seed differences of its quantity, Holm over the primaries only, a five-way verdict
(``calibrl.stats``). Every other ordering the paper states about Tables 2-5 and Figure 6 is **exploratory**: the
same paired test at the unadjusted level, labelled so; a claim that one arm is the best of several is an
intersection-union test over its pairwise differences (the arm minus the max of the others is biased under the
null). The toy's claims (``results/toy/claims.csv``) join as exploratory rows with their own verdicts.

The quantity: per problem, AVG@k (correct samples / n), PASS@k (the unbiased estimator) or the distinct correct
answers, at each of the run's last N evaluated checkpoints, averaged over them; then the mean over each split's
problems and over the splits (the paper's "Avg."). The base model (the warm start) is the arm ``base``, evaluated
at step 0 with each seed's sampling stream. Not the peak over checkpoints (that is selection on the test set).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibrl import modes
from calibrl import stats as S
from calibrl.analysis_plan import BASE, Plan
from calibrl.metrics import pass_at_k
from calibrl.report.load import metrics

COLUMNS = ["claim", "role", "source", "quantity", "estimate", "ci_low", "ci_high", "seeds", "df", "p", "p_holm",
           "p_equiv", "p_equiv_holm", "margin", "verdict", "note", "plan_sha256",
           "ci90_low", "ci90_high", "p_min_effect", "reading"]  # fmt: skip
KEYS = ["model", "method", "seed", "split", "problem"]


@dataclass(frozen=True)
class Claim:
    """An exploratory ordering. ``kind``: "diff" (arms[0] above arms[1]), "best" (arms[0] above every other
    arm), "interior" (one of ``arms[:2]`` above both of ``arms[2:]``). ``metric``: an evaluation key or "entropy"."""

    claim: str
    source: str
    model: str
    metric: str
    kind: str
    arms: tuple[str, ...]
    splits: tuple[tuple[str, float], ...] = ()  # (split, weight); none: every evaluated split, equally


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
            text = f"alpha optimum interior: alpha 1 or 1.5 above both 0 and 2 ({label})"
            out.append(Claim(text, "table5", main, key, "interior", ("iac", "iac_a1.5", "grpo", "iac_a2")))
    # Definition 2.1, where every correct mode is listed (calibrl.modes): the comparison only; against the base
    # model the share would be above 0 by construction (any fall counts, and every trained mode moves)
    if grid["data"]["source"] == "countdown" and {"grpo", "iac"} <= set(tables["table2_3"]):
        over = "share of problems over-sharpened (Definition 2.1: a correct mode below the base model)"
        out.append(Claim(f"IAC over-sharpens less than GRPO: {over}", "definition 2.1", main, "oversharpened",
                         "diff", ("grpo", "iac")))  # fmt: skip
    countdown = grid["data"]["source"] == "countdown"
    if countdown and "train" in grid["data"]["eval_splits"] and "grpo" in tables["table2_3"]:
        # the regime the miniature is meant to be in (issue 33): RL learns its training problems, and sharpens them
        learned = "GRPO above the base model on AVG@8, on its training problems"
        out.append(Claim(f"Regime: {learned}", "regime", main, "avg_at_8", "diff", ("grpo", BASE), (("train", 1.0),)))
        k = grid["eval"]["n"]
        crossover = f"the base model above GRPO on pass@{k}, on GRPO's training problems (the large-k crossover)"
        out.append(Claim(f"Regime: {crossover}", "regime", main, f"pass_at_{k}", "diff", (BASE, "grpo"),
                         (("train", 1.0),)))  # fmt: skip
    f6 = tables["figure6"]
    if len(f6) >= 2:  # the paper's Figure 6: DAPO+IAC (the last listed) keeps more entropy than DAPO (the first)
        names = {"dapo": "DAPO", "dapo_iac": "DAPO+IAC", "dapo_iac_dlc": "DAPO+IAC+DLC"}
        a, b = f6[-1], f6[0]
        text = f"Entropy higher under {names.get(a, a)} than {names.get(b, b)} (last quarter of training)"
        out.append(Claim(text, "figure6", main, "entropy", "diff", (a, b)))
    return out


def problem_quantity(pp: pd.DataFrame, metric: str, last: int, factor: float = 1.0) -> pd.DataFrame:
    """Per (model, method, seed, split, problem): ``metric`` averaged over the ``last`` evaluated checkpoints of
    the runs (the base model's step 0 for arm ``base``); ``factor``: metric oversharpened's (``calibrl.modes``)."""
    if pp.empty:
        return pd.DataFrame(columns=[*KEYS, "q"])
    runs = pp[pp["method"] != BASE]
    steps = sorted(runs["step"].unique())[-last:]
    sub = pd.concat([runs[runs["step"].isin(steps)], pp[pp["method"] == BASE]])
    if metric == "distinct":
        q = sub["distinct"]
    elif metric in modes.READINGS:
        q = _oversharpened(sub, pp[pp["method"] == BASE], factor, metric)
    elif metric.startswith("pass_at_"):
        k = int(metric.rsplit("_", 1)[1])
        q = [pass_at_k(n, c, k) for n, c in zip(sub["n"], sub["correct"])]
    else:  # avg_at_k: the fraction of correct samples
        q = sub["correct"] / sub["n"]
    sub = sub.assign(q=np.asarray(q, dtype=float))
    return sub.groupby(KEYS, as_index=False)["q"].mean()


def _oversharpened(sub: pd.DataFrame, base: pd.DataFrame, factor: float = 1.0, kind: str = "oversharpened"):
    """Per row: 1 when the problem is ``kind`` (``calibrl.modes.reading``: some correct mode's probability below
    ``factor`` times the base model's on the same problem and seed, Definition 2.1 with ``factor`` 1; reallocated or
    declined: another correct mode rose, or none), else 0; NaN where the modes were not measured."""
    ref = {(r.model, r.seed, r.split, r.problem): r.modes for r in base.itertuples()}
    out = []
    for r in sub.itertuples():
        before = ref.get((r.model, r.seed, r.split, r.problem))
        measured = isinstance(r.modes, dict) and isinstance(before, dict)
        out.append(float(modes.reading(kind, r.modes, before, factor)) if measured else np.nan)
    return np.asarray(out, dtype=float)


def sample_of(
    q: pd.DataFrame,
    model: str,
    arms: tuple[str, ...],
    seeds: tuple[int, ...] | None = None,
    weights: dict[str, float] | None = None,
):
    """The arms' (seeds x problems) arrays on the seeds every arm has (only ``seeds`` when given); None when an
    arm is missing. ``weights``: each split's weight in the quantity (splits not named are left out; by default
    every split weighs equally); within a split every problem weighs the same."""
    sub = q[(q["model"] == model) & q["method"].isin(arms)]
    if weights is not None:
        sub = sub[sub["split"].isin([k for k, w in weights.items() if w > 0])]
    common = set.intersection(*(set(sub[sub["method"] == a]["seed"]) for a in arms)) if len(sub) else set()
    common = sorted(common & set(seeds) if seeds is not None else common)
    if not common:
        return None
    sub = sub[sub["seed"].isin(common)].dropna(subset=["q"])
    wide = sub.pivot_table(index=["method", "seed"], columns=["split", "problem"], values="q")
    if any((a, s) not in wide.index for a in arms for s in common):
        return None  # an arm without a value at some seed (e.g. no entropy: DAPO trained nothing at the end)
    if wide.isna().any().any():
        raise ValueError(f"arms {arms} of {model} were not evaluated on the same problems")
    splits = pd.Series(wide.columns.get_level_values("split"))
    share = splits.map(weights or dict.fromkeys(splits, 1.0)).to_numpy(dtype=float)
    per_split = splits.map(splits.value_counts()).to_numpy()
    w = share / per_split
    values = {a: wide.loc[a].loc[common].to_numpy() for a in arms}
    return S.Sample(values, w / w.sum(), np.asarray(pd.factorize(splits)[0]), common)


def primary_sample(claim, pp: pd.DataFrame, model: str, seeds: tuple[int, ...]):
    """A primary claim's sample (``calibrl.analysis_plan.Primary``): its metric at its checkpoints, its splits
    weighed as the plan says, on ``seeds``."""
    q = problem_quantity(pp, claim.metric, claim.checkpoints, claim.factor)
    return sample_of(q, model, claim.arms, seeds, claim.weights())


def entropy_quantity(train: pd.DataFrame) -> pd.DataFrame:
    """Per (model, method, seed): training entropy averaged over the last quarter of the steps (Figure 6)."""
    if train.empty or "entropy" not in train:
        return pd.DataFrame(columns=[*KEYS, "q"])
    last = train[train["step"] > train["step"].max() * 0.75]
    out = last.groupby(["model", "method", "seed"], as_index=False)["entropy"].mean()
    return out.rename(columns={"entropy": "q"}).assign(split="train", problem=0)


def unit_means(d: np.ndarray, units: np.ndarray | None) -> np.ndarray:
    """Per-seed values averaged within each unit of replication (a data seed), in order of first appearance;
    ``d`` itself when no units are given."""
    if units is None:
        return d
    return np.array([d[units == u].mean() for u in dict.fromkeys(units.tolist())])


def _pairwise(sample: S.Sample, a: str, others: tuple[str, ...], scale: float, units=None) -> S.Estimate:
    """Intersection-union: ``a`` above every arm of ``others``; the weakest pairwise test decides (largest p)."""
    tests = [S.paired(unit_means((sample.per_seed(a) - sample.per_seed(o)) * scale, units)) for o in others]
    return max(tests, key=lambda e: (np.nan_to_num(e.p, nan=2.0), -e.estimate))


def contrast(claim: Claim, sample: S.Sample, scale: float, units: np.ndarray | None = None) -> S.Estimate:
    """The claim's test on the sample; ``units``: each seed's data seed, so that the test's units are the data
    seeds, as the primaries' (training seeds of one data seed are averaged first)."""
    a = claim.arms
    if claim.kind == "diff":
        return S.paired(unit_means((sample.per_seed(a[0]) - sample.per_seed(a[1])) * scale, units))
    if claim.kind == "best":
        return _pairwise(sample, a[0], a[1:], scale, units)
    if claim.kind == "interior":  # either interior arm beating both ends: Bonferroni over the two choices
        pairs = (_pairwise(sample, i, a[2:], scale, units) for i in a[:2])
        e = min(pairs, key=lambda e: np.nan_to_num(e.p, nan=2.0))
        e.p = min(1.0, 2 * e.p) if np.isfinite(e.p) else e.p
        return e
    raise ValueError(f"unknown claim kind {claim.kind!r}")


def _row(
    text: str, role: str, source: str, quantity: str, e: S.Estimate | None, note: str = "", seeds: int = 0
) -> dict:
    """A claims.csv row; ``seeds``: the training seeds behind ``e`` when its units are data seeds."""
    if e is None:
        return {"claim": text, "role": role, "source": source, "quantity": quantity, "seeds": 0, "note": note}
    return {"claim": text, "role": role, "source": source, "quantity": quantity, "estimate": e.estimate,
            "ci_low": e.ci_low, "ci_high": e.ci_high, "seeds": seeds or e.seeds, "df": e.seeds - 1, "p": e.p,
            "p_equiv": e.p_equiv, "margin": e.margin, "note": note}  # fmt: skip


def exploratory(
    pp: pd.DataFrame, train: pd.DataFrame, grid: dict, skip: set = frozenset(), plan: Plan | None = None
) -> pd.DataFrame:
    """The paper's orderings (but those in ``skip``: (model, metric, arms) the primaries decide), unadjusted; on
    seeds of several data seeds (the plan's), tested over data seeds, as the primaries."""
    data_of = plan.data_of if plan else {}
    last = int(grid["claims"]["last_checkpoints"])
    q = {key: problem_quantity(pp, key, last) for key in metrics(grid)}
    q["entropy"] = entropy_quantity(train)
    q["oversharpened"] = problem_quantity(pp, "oversharpened", last)
    rows = []
    for c in paper_claims(grid):
        if (c.model, c.metric, frozenset(c.arms)) in skip:
            continue
        if c.metric in modes.READINGS and q[c.metric]["q"].isna().any():  # some evaluation did not measure modes
            rows.append(
                _row(c.claim, "exploratory", c.source, "not measured on every evaluation", None)
                | {"verdict": "inconclusive", "note": "modes not measured: evaluations made before they were"}
            )
            continue
        if c.metric not in q:  # a metric no table shows (the regime's pass@n)
            q[c.metric] = problem_quantity(pp, c.metric, last)
        sample = sample_of(q[c.metric], c.model, c.arms, None, dict(c.splits) or None)
        scale = 1.0 if c.metric == "entropy" else 100.0
        quantity = "entropy, last quarter" if c.metric == "entropy" else f"{c.metric}, mean of last {last} checkpoints"
        if c.splits:
            quantity += ", on " + ", ".join(k for k, _ in c.splits)
        e, seeds = None, 0
        if sample is not None:
            units = np.array([data_of.get(s, grid["data"]["seed"]) for s in sample.seeds])
            several = len(set(units.tolist())) > 1  # else a test over training seeds, given one data seed's problems
            e, seeds = contrast(c, sample, scale, units if several else None), sample.n_seeds
            quantity += f"; t over {len(set(units.tolist()))} data seeds" if several else "; t over training seeds"
        row = _row(c.claim, "exploratory", c.source, quantity, e, seeds=seeds)
        row["verdict"] = S.verdict(row.get("estimate", np.nan), row.get("p", np.nan))
        rows.append(row)
    rows += [r for c in (plan.claims() if plan else ()) for r in readings_beside(plan, pp, grid["main_model"], c)]
    return pd.DataFrame(rows, columns=COLUMNS)


def readings_beside(plan: Plan, pp: pd.DataFrame, model: str, c) -> list[dict]:
    """Beside a plan claim on the reallocation reading of Definition 2.1, the same comparison on the plain decline
    (every correct mode fell: the policy drifting off the task) and on any fall (the plain definition), exploratory:
    what the reallocation reading leaves out, on the plan's seeds."""
    out = []
    if c.metric != "reallocated":
        return out
    for reading in ("declined", "oversharpened"):
        sample = sample_of(problem_quantity(pp, reading, c.checkpoints, c.factor), model, c.arms, plan.seeds,
                           c.weights())  # fmt: skip
        if sample is None:
            continue
        e = S.paired(unit_differences(plan, sample, c))
        side = "above" if c.direction > 0 else "below"
        text = f"{c.id} beside: {c.arms[0]} {side} {c.arms[1]} on the share of problems {reading} (Definition 2.1)"
        splits = ", ".join(k for k, _ in c.splits)
        quantity = f"{reading} (factor {c.factor:g}), on {splits}; t over {len(plan.data_seeds)} data seeds"
        out.append(_row(text, "exploratory", plan.path, quantity, e, seeds=sample.n_seeds)
                   | {"verdict": S.verdict(e.estimate, e.p, direction=c.direction)})  # fmt: skip
    return out


def unit_differences(plan: Plan, sample: S.Sample, claim) -> np.ndarray:
    """The claim's paired differences (in its unit) averaged per data seed, in the plan's order of data seeds: the
    units its test replicates over (each data seed's training seeds are nested in it, not independent draws)."""
    d = (sample.per_seed(claim.arms[0]) - sample.per_seed(claim.arms[1])) * claim.scale
    unit = np.array([plan.data_of[s] for s in sample.seeds])
    return np.array([d[unit == u].mean() for u in plan.data_seeds])


def primary(plan: Plan, pp: pd.DataFrame, model: str, role: str = "primary") -> pd.DataFrame:
    """The plan's primary claims on ``model`` (``role`` "secondary": its secondary family), decided together
    (``calibrl.stats.decide`` on the per-data-seed means of the paired differences: Holm over the family for the
    difference and the equivalence p-values alike, five-way verdicts). A claim misses none of the plan's seeds, or it
    is not decided."""
    family = plan.primaries if role == "primary" else plan.secondaries
    rows, diffs = [], []
    for c in family:
        sample = primary_sample(c, pp, model, plan.seeds)
        weighed = ", ".join(f"{k} {w:g}" for k, w in c.splits)
        quantity = (
            f"{c.metric} ({c.unit}), mean of last {c.checkpoints} checkpoint(s), splits weighed {weighed}; paired per "
            f"training seed, averaged per data seed, t on the {len(plan.data_seeds)} data seeds"
        )
        missing = len(plan.seeds) - (sample.n_seeds if sample else 0)
        if sample is None or missing:
            diffs.append(None)
            note = f"{missing} of the plan's {len(plan.seeds)} seeds missing: not decided"
            rows.append(_row(f"{c.id}: {c.claim}", role, plan.path, quantity, None, note))
            continue
        diffs.append(unit_differences(plan, sample, c))
        rows.append({"claim": f"{c.id}: {c.claim}", "role": role, "source": plan.path, "quantity": quantity})
    decision = S.decide(diffs, [c.margin for c in family], [c.direction for c in family], plan.level)
    for row, e, c in zip(rows, decision.estimates, family):
        if e is not None:
            per = len(plan.seeds) // len(plan.data_seeds)
            note = f"margin +-{c.margin:g} {c.unit}; {len(plan.data_seeds)} data seeds x {per} training seeds"
            row.update(_row(row["claim"], role, plan.path, row["quantity"], e, note) | {"seeds": len(plan.seeds)})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["p_holm"] = decision.p_holm
    frame["p_equiv_holm"] = decision.p_equiv_holm
    frame["verdict"] = decision.verdicts
    small = (frame["verdict"] == "negligible").to_numpy()
    frame.loc[small, "note"] += "; different from zero, yet inside the margin: smaller than the plan's smallest effect"
    # beside each verdict, its 90% interval against the margin, the minimum-effect p and the reading (unadjusted)
    nan = (float("nan"),) * 3
    margin = [S.against_margin(e, c.direction, plan.level) if e else nan for e, c in zip(decision.estimates, family)]
    frame["ci90_low"], frame["ci90_high"], frame["p_min_effect"] = zip(*margin)
    frame["reading"] = [
        S.reading(v, e, c.direction, plan.level) for v, e, c in zip(decision.verdicts, decision.estimates, family)
    ]
    return frame


def base_changes(plan: Plan, pp: pd.DataFrame, model: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    """Each arm of the plan against the base model it started from, per evaluation split and metric, on the plan's
    seeds (descriptive: the estimate and its 95% interval over data seeds, unadjusted): what RL did to held-out
    problems, beside what it did to the problems it trained on."""
    rows = []
    arms = sorted(plan.arms())
    for metric in metrics:
        q = problem_quantity(pp, metric, max(c.checkpoints for c in plan.claims()))
        for split in sorted(set(q["split"])):
            for arm in arms:
                sample = sample_of(q, model, (arm, BASE), plan.seeds, {split: 1.0})
                if sample is None:
                    continue
                d = (sample.per_seed(arm) - sample.per_seed(BASE)) * 100.0
                e = S.paired(unit_means(d, np.array([plan.data_of[s] for s in sample.seeds])))
                rows.append({"arm": arm, "split": split, "metric": metric, "estimate": e.estimate,
                             "ci_low": e.ci_low, "ci_high": e.ci_high, "data_seeds": e.seeds})  # fmt: skip
    return pd.DataFrame(rows, columns=["arm", "split", "metric", "estimate", "ci_low", "ci_high", "data_seeds"])


def grid_claims(pp: pd.DataFrame, train: pd.DataFrame, grid: dict, plan: Plan | None) -> pd.DataFrame:
    """Primary claims (when a plan is set) then the exploratory ones, each row stamped with the plan's hash."""
    main = grid["main_model"]
    frames, skip = [], set()
    if plan is not None:
        frames.append(primary(plan, pp, main))
        if plan.secondaries:
            frames.append(primary(plan, pp, main, "secondary"))
        skip = {(main, c.metric, frozenset(c.arms)) for c in plan.primaries}
    frames.append(exploratory(pp, train, grid, skip, plan))
    out = pd.concat([f for f in frames if len(f)] or frames[-1:], ignore_index=True)
    return out.assign(plan_sha256=plan.sha256 if plan else "")[COLUMNS]


def with_toy(claims: pd.DataFrame, toy: pd.DataFrame) -> pd.DataFrame:
    """The toy's rows appended as exploratory (their verdicts are the toy's own, ``calibrl.toy.verdicts``)."""
    if toy.empty:
        return claims
    toy = toy.assign(role="exploratory", plan_sha256=claims["plan_sha256"].iloc[0] if len(claims) else "")
    if "verdict" not in toy:
        toy["verdict"] = [S.verdict(e, p) for e, p in zip(toy["estimate"], toy["p"])]
    return pd.concat([claims, toy.reindex(columns=COLUMNS)], ignore_index=True)


def render(frame: pd.DataFrame) -> list[str]:
    """The claims as a Markdown table (primaries first: their 90% interval against the margin and minimum-effect p
    beside the verdict's reading), with the counts of each verdict per role."""
    lines = [
        "| claim | role | estimate | 95% CI | 90% CI, margin | p min. effect | seeds | p (Holm within a family) | "
        "verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in frame.reindex(columns=COLUMNS).itertuples():  # a claims.csv of an older version lacks the new columns
        est = "-" if pd.isna(r.estimate) else f"{r.estimate:+.2f}"
        ci = "-" if pd.isna(r.ci_low) else f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
        ci90 = "-" if pd.isna(r.ci90_low) else f"[{r.ci90_low:+.2f}, {r.ci90_high:+.2f}], +-{r.margin:g}"
        p_min = "-" if pd.isna(r.p_min_effect) else f"{r.p_min_effect:.3g}"
        p = r.p_holm if r.role in ("primary", "secondary") else r.p
        p = "-" if pd.isna(p) else f"{p:.3g}"
        shown = r.reading if isinstance(r.reading, str) and r.reading else r.verdict
        lines.append(f"| {r.claim} | {r.role} | {est} | {ci} | {ci90} | {p_min} | {r.seeds} | {p} | **{shown}** |")
    lines.append("")
    for role in ("primary", "secondary", "exploratory"):
        counts = frame[frame["role"] == role]["verdict"].value_counts()
        if counts.sum():
            lines.append(f"{role}: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in S.VERDICTS) + ".")
    return lines
