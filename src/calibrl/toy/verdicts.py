"""A verdict for each claim the paper makes about the toy figures, from every seed's trajectory.

Every claim is reduced to comparisons, each a contrast of per-seed values (``seeds.csv.gz``):
- "A collapses faster than B": the time-averaged dominance (``dominance_auc``) of A minus B's;
- a threshold ("IAC + DLC leaves at most 5% of seeds collapsed") is contrasted with its baseline (the
  baseline configuration meets many thresholds too): the claimed configuration must beat the baseline and meet
  the threshold itself; "every estimator collapses" is a one-sample contrast against its bound.
Configurations of one figure share seeds (seed i of every configuration starts from the same random stream),
so each contrast is paired: the standard error is that of the per-seed differences. A comparison is
significant at the two-sided normal p-value after Holm across the claim's comparisons, and counts only when
the effect is at least ``MIN_EFFECT`` of its metric. A claim ``holds`` when every comparison holds,
is ``contradicted`` when any comparison is significant in the opposite direction, else ``inconclusive``.
The claims then join the grid's in one Holm family in ``results/claims.csv`` (``claims_rows``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as st

from calibrl.stats import LEVEL, holm
from calibrl.toy.figures import FACTOR_COLUMNS, dominance

# Smallest effect that counts, per metric: 0.01 of dominance (0.5 balanced .. 1 collapsed) or of held-out
# probability, time-averaged; 5 points of a fraction of seeds.
MIN_EFFECT = {"dominance_auc": 0.01, "heldout_auc": 0.01, "collapsed_end": 0.05, "dominance_end": 0.01}


def per_seed(traj: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and seed: dominance_auc, heldout_auc, dominance_end, collapsed_end (0/1)."""
    frame = traj.assign(dominance=dominance(traj))
    keys = [c for c in FACTOR_COLUMNS if c in frame] + ["seed"]
    g = frame.groupby(keys, dropna=False)
    out = pd.DataFrame({"dominance_auc": g["dominance"].mean()})
    if "p_siamese_heldout" in frame:
        out["heldout_auc"] = g["p_siamese_heldout"].mean()
    last = frame[frame["step"] == frame["step"].max()].set_index(keys)
    out["dominance_end"] = last["dominance"]
    out["collapsed_end"] = (last["dominance"] >= 0.99).astype(float)
    return out.reset_index()


def _seeds(frame: pd.DataFrame, metric: str, **where) -> pd.Series:
    sub = frame
    for key, value in where.items():
        sub = sub[sub[key].astype(str) == str(value)]
    if sub.empty or sub["seed"].duplicated().any():
        raise KeyError(f"expected one configuration for {where}, found {sub.drop(columns='seed').drop_duplicates()}")
    return sub.set_index("seed")[metric]


def _test(claim: str, context: str, comparison: str, metric: str, diff: pd.Series, direction: int) -> dict:
    """Paired contrast: ``diff`` per seed; ``direction`` +1 if the claim says it is positive."""
    n = int(diff.notna().sum())
    est = float(diff.mean())
    se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    if se > 0:
        p = float(2 * st.norm.sf(abs(est) / se))
    else:  # every seed agrees exactly: significant unless there is no difference at all
        p = 1.0 if est == 0 or not np.isfinite(se) else 0.0
    return {"claim": claim, "context": context, "comparison": comparison, "metric": metric,
            "estimate": est * direction, "se": se, "z": est * direction / se if se > 0 else float("nan"),
            "p": p, "seeds": n, "min_effect": MIN_EFFECT[metric]}  # fmt: skip


def _compare(claim, context, frame, metric, a: dict, b: dict, a_name, b_name, larger: bool) -> dict:
    diff = _seeds(frame, metric, **a) - _seeds(frame, metric, **b)
    return _test(claim, context, f"{a_name} {'>' if larger else '<'} {b_name}", metric, diff, 1 if larger else -1)


def _against_baseline(claim, context, frame, metric, a: dict, base: dict, op: str, bound: float) -> list[dict]:
    """Threshold ``metric op bound`` for ``a``, contrasted with ``base``: a beats the baseline, and meets it."""
    larger = op == ">="
    rows = [_compare(claim, context, frame, metric, a, base, "claimed", "baseline", larger)]
    x = _seeds(frame, metric, **a) - bound
    rows.append(_test(claim, context, f"{metric} {op} {bound}", metric, x, 1 if larger else -1))
    return rows


CLAIMS = {
    "G": "Larger G delays collapse (Section 2.4, Fig. 1)",
    "estimators": "Raw rewards collapse fastest, mean-shifted slower, normalized slowest (Section 2.4, Fig. 1)",
    "persists": "Every estimator eventually collapses onto one correct label (Section 2.4; Appendix G, Fig. 3)",
    "advanced": "RLOO and Reinforce++ with baseline collapse more slowly than raw rewards (Appendix G, Fig. 3)",
    "coupling": "Training on Persian squeezes the held-out Siamese class, faster at higher similarity "
    "(Section 2.4, Fig. 2)",
    "coupling_G": "Larger G squeezes the held-out class faster (Section 2.4, Fig. 2)",
    "optimizers": "Momentum and AdamW accelerate collapse relative to SGD (Appendix G, Fig. 4)",
    "iac": "IAC retards collapse relative to the uncalibrated baseline (Appendix H, Fig. 5)",
    "iac_dlc": "IAC + DLC arrests collapse and keeps both correct labels, even under AdamW (Appendix H, Fig. 5)",
}


def comparisons(seeds: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every comparison behind every claim, from each figure's per-seed values (``per_seed``), Holm within
    each claim."""
    rows: list[dict] = []
    auc = "dominance_auc"
    f1, f2, f3, f4, f5 = (seeds[k] for k in ("fig1", "fig2", "fig3", "fig4", "fig5"))
    sizes = sorted(f1["group_size"].unique())
    g_lo, g_hi = sizes[0], sizes[-1]
    for est in f1["estimator"].unique():
        a, b = dict(estimator=est, group_size=g_lo), dict(estimator=est, group_size=g_hi)
        rows.append(_compare("G", f"fig1 estimator={est}", f1, auc, a, b, f"G={g_lo}", f"G={g_hi}", True))
    for g in sizes:
        for a, b in (("raw", "mean"), ("mean", "norm")):
            x, y = dict(estimator=a, group_size=g), dict(estimator=b, group_size=g)
            rows.append(_compare("estimators", f"fig1 G={g}", f1, auc, x, y, a, b, True))
    for name, frame in (("fig1", f1), ("fig3", f3)):
        for (est, g), sub in frame.groupby(["estimator", "group_size"]):
            x = sub.set_index("seed")["collapsed_end"] - 0.5
            rows.append(_test("persists", f"{name} estimator={est} G={g}", "collapsed_end >= 0.5", "collapsed_end",
                              x, 1))  # fmt: skip
    for g in sizes:
        for est in ("rloo", "rpp"):
            x, y = dict(estimator=est, group_size=g), dict(estimator="raw", group_size=g)
            rows.append(_compare("advanced", f"fig3 G={g}", f3, auc, x, y, est, "raw", False))
    for g in sizes:
        for a, b in (("high", "mid"), ("mid", "low")):
            x, y = dict(siamese=a, group_size=g), dict(siamese=b, group_size=g)
            rows.append(_compare("coupling", f"fig2 G={g}", f2, "heldout_auc", x, y, a, b, False))
    for sim in ("high", "mid", "low"):
        x, y = dict(siamese=sim, group_size=g_hi), dict(siamese=sim, group_size=g_lo)
        rows.append(_compare("coupling_G", f"fig2 siamese={sim}", f2, "heldout_auc", x, y, f"G={g_hi}",
                             f"G={g_lo}", False))  # fmt: skip
    for g in sizes:
        for opt in ("momentum", "adamw"):
            x, y = dict(optimizer=opt, group_size=g), dict(optimizer="sgd", group_size=g)
            rows.append(_compare("optimizers", f"fig4 G={g}", f4, auc, x, y, opt, "sgd", True))
    for (est, opt, g), _ in f5.groupby(["estimator", "optimizer", "group_size"]):
        ctx = f"fig5 estimator={est} optimizer={opt} G={g}"
        cell = dict(estimator=est, optimizer=opt, group_size=g)
        base, iac, both = ({**cell, "variant": v} for v in ("baseline", "iac", "iac+dlc"))
        rows.append(_compare("iac", ctx, f5, auc, iac, base, "iac", "baseline", False))
        rows.append(_compare("iac_dlc", ctx, f5, auc, both, base, "iac+dlc", "baseline", False))
        rows += _against_baseline("iac_dlc", ctx, f5, "collapsed_end", both, base, "<=", 0.05)
        rows += _against_baseline("iac_dlc", ctx, f5, "dominance_end", both, base, "<=", 0.9)
    comp = pd.DataFrame(rows)
    comp["p_holm"] = np.nan
    for claim in comp["claim"].unique():
        where = comp["claim"] == claim
        comp.loc[where, "p_holm"] = holm(comp.loc[where, "p"].tolist())
    sig = (comp["p_holm"] < LEVEL) & (comp["estimate"].abs() >= comp["min_effect"])
    comp["outcome"] = np.where(sig & (comp["estimate"] > 0), "holds",
                               np.where(sig & (comp["estimate"] < 0), "contradicted", "inconclusive"))  # fmt: skip
    return comp


def verdicts(comp: pd.DataFrame) -> pd.DataFrame:
    """Per claim: holds (every comparison holds), contradicted (any is reversed), else inconclusive."""
    out = []
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        held, reversed_ = int((sub["outcome"] == "holds").sum()), int((sub["outcome"] == "contradicted").sum())
        verdict = "contradicted" if reversed_ else ("holds" if held == len(sub) else "inconclusive")
        out.append({"claim": claim, "statement": text, "verdict": verdict, "held": held,
                    "contradicted": reversed_, "tested": len(sub)})  # fmt: skip
    return pd.DataFrame(out)


def claims_rows(comp: pd.DataFrame) -> pd.DataFrame:
    """One row per toy claim for ``results/claims.csv``: the deciding comparison (a reversed one if any, else
    the weakest), its estimate in the claimed direction, a 95% interval, and the claim's p-value (the largest
    within-claim Holm p when all point the claimed way: an intersection-union test)."""
    rows = []
    z = st.norm.ppf(1 - LEVEL / 2)
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        rev = sub[sub["outcome"] == "contradicted"]
        r = rev.loc[rev["p_holm"].idxmin()] if len(rev) else sub.loc[sub["p_holm"].idxmax()]
        rows.append({"claim": f"{text}: {r['context']}, {r['comparison']}", "source": "toy",
                     "quantity": f"{r['metric']} per seed, paired", "estimate": r["estimate"],
                     "ci_low": r["estimate"] - z * r["se"], "ci_high": r["estimate"] + z * r["se"],
                     "seeds": int(r["seeds"]), "p": r["p_holm"], "min_effect": r["min_effect"]})  # fmt: skip
    return pd.DataFrame(rows)


def render_markdown(comp: pd.DataFrame, summary: pd.DataFrame, settings: dict) -> str:
    lines = [
        "# Toy experiments: verdicts on the paper's claims",
        "",
        "Generated by the rule `toy_verdicts` from every seed's trajectory (`results/toy/fig*/seeds.csv.gz`).",
        "Each comparison is a paired contrast over seeds (configurations share seeds), significant at",
        f"{LEVEL:g} after Holm across the claim's comparisons and at least its minimum effect {MIN_EFFECT}.",
        "A claim holds when every comparison holds, is contradicted when any is significantly reversed,",
        "else it is inconclusive. Thresholds are contrasted with the baseline. `dominance` is the share of the",
        "correct mass held by the larger of p(Cat), p(Persian) (0.5 balanced, 1 collapsed); its time average",
        "(`dominance_auc`) measures collapse speed. `heldout_auc` is the time average of p(Siamese | Siamese).",
        "`results/claims.csv` carries each claim's deciding comparison into one Holm family with the RLVR grid's",
        "claims, so a claim that holds here can be inconclusive there (never the reverse).",
        "",
        "Setting: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
        "| claim | verdict | held | reversed |",
        "|---|---|---|---|",
    ]
    for _, row in summary.iterrows():
        lines.append(
            f"| {row['statement']} | **{row['verdict']}** | {row['held']}/{row['tested']} | {row['contradicted']} |"
        )
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        lines += ["", f"## {text}", "", "| context | comparison | metric | estimate | SE | z | p (Holm) | outcome |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for _, r in sub.iterrows():
            z = "" if math.isnan(r["z"]) else f"{r['z']:.1f}"
            lines.append(
                f"| {r['context']} | {r['comparison']} | {r['metric']} | {r['estimate']:+.3f} | {r['se']:.3f} | "
                f"{z} | {r['p_holm']:.2g} | {r['outcome']} |"
            )
    return "\n".join(lines) + "\n"
