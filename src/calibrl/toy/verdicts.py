"""A verdict for each claim the paper makes about the toy figures, from every seed's trajectory.

The toy's claims are exploratory: the RLVR grid's pre-registered claims are their own Holm family, and these
rows (``claims_rows``, ``role`` "exploratory") do not join it.

Every claim is reduced to comparisons, each a contrast of per-seed values (``seeds.csv.gz``):
- "A collapses faster than B": the time-averaged dominance (``dominance_auc``) of A minus B's;
- a threshold ("IAC + DLC leaves at most 5% of seeds collapsed") is contrasted with its baseline (the
  baseline configuration meets many thresholds too): the claimed configuration must beat the baseline and meet
  the threshold itself; "every estimator collapses" is a one-sample contrast against its bound.
Configurations of one figure share seeds (seed i of every configuration samples with the same uniforms), so
each contrast is paired: a test of the per-seed differences.

Tests (two-sided, per comparison):
- continuous metrics: Student's t on the per-seed differences (n - 1 degrees of freedom). When the differences
  have no spread (every seed's difference is the same) t is undefined (0 / 0 or c / 0), and the exact sign test
  is used instead (equivalently the sign-flip permutation test): p = 1 when every difference is 0, else
  p = 2^-(n-1) (all n differences non-zero and of one sign);
- the fraction of collapsed seeds (``collapsed_end``, 0/1 per seed): the exact binomial test against a bound,
  McNemar's exact test (a binomial test on the discordant seeds) between two configurations; both are valid
  with any spread, none included.
- equivalence ("absent"): two one-sided tests (TOST) at the margin ``MIN_EFFECT`` of the metric, for contrasts
  of two configurations (not thresholds): t (or, with no spread, the exact sign tests: p = 2^-n when the common
  difference lies inside the margin, else 1), and for the 0/1 metric the exact conservative binomial tests
  P(Binomial(n, margin) <= seeds moving each way).
Holm adjusts each kind of p-value across the claim's comparisons (every context and learning rate). A
comparison ``holds`` when it is significant in the claimed direction with an effect of at least ``MIN_EFFECT``,
is ``contradicted`` when that holds in the opposite direction, ``absent`` when the equivalence test is
significant, else ``inconclusive``.

The learning-rate range. The advantage scale acts as a step size, so a comparison at one learning rate is
conditional on it. Every configuration is simulated at each learning rate of the range (``toy.lr_scales``
times each optimizer's ``toy.lr``; configurations are compared at the same scale, so an optimizer comparison
pairs each optimizer's lr at that scale), over ``toy.steps`` steps. A claim is an intersection over its
comparisons at every learning rate of the range (intersection-union): it ``holds`` only when every comparison
holds at every learning rate; it is ``contradicted`` when any comparison at any learning rate is significantly
reversed; else ``absent`` when some comparison is shown equivalent to no effect (so the claim fails there
without a reversal); else ``inconclusive``. Each row states the range it was decided over and the verdict at
each learning rate (the same rule within one scale), so a claim that holds only at some learning rates shows as
conditional on them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats as st

from calibrl.stats import LEVEL, holm
from calibrl.toy.figures import FACTOR_COLUMNS, dominance, lr_scales

# Smallest effect that counts, per metric: 0.01 of dominance (0.5 balanced .. 1 collapsed) or of held-out
# probability, time-averaged; 5 points of a fraction of seeds. It is also the equivalence margin.
MIN_EFFECT = {"dominance_auc": 0.01, "heldout_auc": 0.01, "collapsed_end": 0.05, "dominance_end": 0.01}
BINARY = ("collapsed_end",)  # 0/1 per seed: exact binomial tests
OUTCOMES = ("holds", "contradicted", "absent", "inconclusive")
SPREAD_TOL = 1e-12  # differences within this (relative to their size) of each other have no spread


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


def no_spread(x: np.ndarray) -> bool:
    """Whether every value of ``x`` is the same (up to rounding: ``c - b`` computed per seed may differ in the
    last bits)."""
    return bool(np.ptp(x) <= SPREAD_TOL * max(1.0, float(np.abs(x).max())))


def sign_test_p(x: np.ndarray) -> float:
    """Two-sided exact sign test that the differences ``x`` are centred on 0 (the sign-flip permutation test when
    they all share one value): ties (zeros) are dropped; 1 when every difference is 0."""
    pos, neg = int((x > 0).sum()), int((x < 0).sum())
    return float(st.binomtest(pos, pos + neg, 0.5).pvalue) if pos + neg else 1.0


def _test(claim: str, context: str, comparison: str, metric: str, diff: pd.Series, direction: int,
          bound: float | None = None) -> dict:  # fmt: skip
    """Paired contrast: ``diff`` per seed (``values - bound`` for a threshold, one-sample); ``direction`` +1 if
    the claim says it is positive. Returns the estimate in the claimed direction, its 95% interval, the
    two-sided p and, for contrasts of two configurations, the equivalence p at the margin."""
    x = diff.dropna().to_numpy(dtype=float)
    n, margin = len(x), MIN_EFFECT[metric]
    est = float(x.mean()) if n else float("nan")
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    q = st.t.ppf(1 - LEVEL / 2, n - 1) if n > 1 else float("nan")
    p_equiv, test = float("nan"), "t"
    if n < 2:
        p, lo, hi, test = float("nan"), float("nan"), float("nan"), "none"
    elif metric in BINARY and bound is not None:  # fraction of seeds against a bound: exact binomial
        k = int(round(float((x + bound).sum())))
        res = st.binomtest(k, n, bound)
        ci = res.proportion_ci(1 - LEVEL, method="exact")
        p, lo, hi, test = float(res.pvalue), ci.low - bound, ci.high - bound, "binomial"
    elif metric in BINARY:  # two configurations, 0/1 per seed: McNemar's exact test on the discordant seeds
        up, down = int((x > 0).sum()), int((x < 0).sum())
        p, test = sign_test_p(x), "mcnemar"
        lo, hi = (est - q * se, est + q * se) if se > 0 else (est, est)
        tail = st.binom(n, margin).cdf  # P(Binomial(n, margin) <= k): exact, conservative TOST
        p_equiv = float(max(tail(up), tail(down)))
    elif no_spread(x):  # t undefined: the exact sign test
        p, lo, hi, test = sign_test_p(x), est, est, "sign"
        if bound is None:
            p_equiv = 0.5**n if abs(est) < margin else 1.0
    else:
        p = float(2 * st.t.sf(abs(est) / se, n - 1))
        lo, hi = est - q * se, est + q * se
        if bound is None:
            p_equiv = float(max(st.t.sf((est + margin) / se, n - 1), st.t.cdf((est - margin) / se, n - 1)))
    lo, hi = sorted((lo * direction, hi * direction))
    return {"claim": claim, "context": context, "comparison": comparison, "metric": metric,
            "estimate": est * direction, "se": se, "ci_low": lo, "ci_high": hi, "test": test, "p": p,
            "p_equiv": p_equiv, "seeds": n, "min_effect": margin}  # fmt: skip


def _compare(claim, context, frame, metric, a: dict, b: dict, a_name, b_name, larger: bool) -> dict:
    diff = _seeds(frame, metric, **a) - _seeds(frame, metric, **b)
    return _test(claim, context, f"{a_name} {'>' if larger else '<'} {b_name}", metric, diff, 1 if larger else -1)


def _against_baseline(claim, context, frame, metric, a: dict, base: dict, op: str, bound: float) -> list[dict]:
    """Threshold ``metric op bound`` for ``a``, contrasted with ``base``: a beats the baseline, and meets it."""
    larger = op == ">="
    rows = [_compare(claim, context, frame, metric, a, base, "claimed", "baseline", larger)]
    x = _seeds(frame, metric, **a) - bound
    rows.append(_test(claim, context, f"{metric} {op} {bound}", metric, x, 1 if larger else -1, bound=bound))
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


def _scale_comparisons(f1, f2, f3, f4, f5) -> list[dict]:
    """Every comparison behind every claim at one learning rate (figures restricted to one ``lr_scale``)."""
    rows: list[dict] = []
    auc = "dominance_auc"
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
                              x, 1, bound=0.5))  # fmt: skip
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
    return rows


def outcomes(comp: pd.DataFrame) -> np.ndarray:
    """Each comparison's outcome from its Holm p-values (``p_holm``, ``p_equiv_holm``) and effect."""
    big = comp["estimate"].abs() >= comp["min_effect"] * (1 - 1e-9)  # 0.05 - 0 is 0.05 up to rounding
    sig = (comp["p_holm"] < LEVEL) & big
    equiv = comp["p_equiv_holm"] < LEVEL
    return np.select([sig & (comp["estimate"] > 0), sig & (comp["estimate"] < 0), equiv], OUTCOMES[:3],
                     "inconclusive")  # fmt: skip


def comparisons(seeds: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every comparison behind every claim, at every learning rate of the range (``lr_scale``), from each
    figure's per-seed values (``per_seed``); Holm within each claim (over its contexts and learning rates)."""
    figs = [seeds[k] for k in ("fig1", "fig2", "fig3", "fig4", "fig5")]
    figs = [f if "lr_scale" in f else f.assign(lr_scale=1.0) for f in figs]
    scales = sorted(set.intersection(*(set(f["lr_scale"].astype(float)) for f in figs)))
    if not scales:
        raise ValueError("the toy figures share no learning-rate scale")
    rows = []
    for scale in scales:
        at = [f[f["lr_scale"].astype(float) == scale] for f in figs]
        rows += [{**r, "lr_scale": scale} for r in _scale_comparisons(*at)]
    comp = pd.DataFrame(rows)
    comp["p_holm"] = np.nan
    comp["p_equiv_holm"] = np.nan
    for claim in comp["claim"].unique():
        where = comp["claim"] == claim
        for col in ("p", "p_equiv"):
            values = comp.loc[where, col]
            tested = values.notna()
            if tested.any():
                comp.loc[values[tested].index, f"{col}_holm"] = holm(values[tested].tolist())
    comp["outcome"] = outcomes(comp)
    return comp


def combine(outcome: pd.Series) -> str:
    """One verdict from comparisons' outcomes (intersection-union): contradicted if any is reversed; holds if
    all hold; absent if any is shown absent; else inconclusive."""
    values = set(outcome)
    if "contradicted" in values:
        return "contradicted"
    if values == {"holds"}:
        return "holds"
    return "absent" if "absent" in values else "inconclusive"


def _per_lr(sub: pd.DataFrame) -> str:
    return ", ".join(f"x{scale:g} {combine(g['outcome'])}" for scale, g in sub.groupby("lr_scale"))


def verdicts(comp: pd.DataFrame) -> pd.DataFrame:
    """Per claim: the verdict over the learning-rate range (``combine``), the counts of outcomes and the verdict at
    each learning rate."""
    out = []
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        counts = sub["outcome"].value_counts()
        out.append({"claim": claim, "statement": text, "verdict": combine(sub["outcome"]),
                    "held": int(counts.get("holds", 0)), "contradicted": int(counts.get("contradicted", 0)),
                    "absent": int(counts.get("absent", 0)), "tested": len(sub), "per_lr": _per_lr(sub)})  # fmt: skip
    return pd.DataFrame(out)


def range_note(cfg: dict) -> str:
    """The range the claims were decided over, from the ``toy`` config: scales, each optimizer's learning rates,
    the horizon."""
    scales = lr_scales(cfg)
    lrs = "; ".join(f"{opt} {{{', '.join(f'{lr * s:g}' for s in scales)}}}" for opt, lr in cfg["lr"].items())
    return f"over lr x{{{', '.join(f'{s:g}' for s in scales)}}} ({lrs}), {cfg['steps']} steps"


def claims_rows(comp: pd.DataFrame, note: str = "") -> pd.DataFrame:
    """One row per toy claim for ``results/claims.csv`` (role "exploratory": not in the grid's Holm family): the
    deciding comparison (the most significant reversal if any, else the most significant equivalence when the
    verdict is absent, else the weakest comparison that does not hold, else the weakest), its estimate in the
    claimed direction with its 95% interval, its within-claim Holm p (for a claim that holds, the largest over the
    range: the intersection-union test), the verdict over the range, and ``note``: the range it was decided over
    (``range_note``) with the verdict at each learning rate; then its equivalence p (within-claim Holm) and margin
    (``MIN_EFFECT``)."""
    rows = []
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        verdict = combine(sub["outcome"])
        p_col = "p_holm"
        if verdict == "contradicted":
            rev = sub[sub["outcome"] == "contradicted"]
            r = rev.loc[rev["p_holm"].idxmin()]
        elif verdict == "absent":
            eq = sub[sub["outcome"] == "absent"]
            r, p_col = eq.loc[eq["p_equiv_holm"].idxmin()], "p_equiv_holm"
        else:
            pool = sub[sub["outcome"] != "holds"] if verdict != "holds" else sub
            r = pool.loc[pool["p_holm"].fillna(1.0).idxmax()]
        rows.append({"claim": f"{text}: {r['context']}, {r['comparison']} (lr x{r['lr_scale']:g})", "source": "toy",
                     "quantity": f"{r['metric']} per seed, paired ({r['test']})", "estimate": r["estimate"],
                     "ci_low": r["ci_low"], "ci_high": r["ci_high"], "seeds": int(r["seeds"]), "p": r[p_col],
                     "verdict": verdict, "role": "exploratory",
                     "note": "; ".join(filter(None, [note, f"per lr: {_per_lr(sub)}"])),
                     "p_equiv": r["p_equiv_holm"], "margin": r["min_effect"]})  # fmt: skip
    return pd.DataFrame(rows)


def render_markdown(comp: pd.DataFrame, summary: pd.DataFrame, settings: dict, note: str = "") -> str:
    lines = [
        "# Toy experiments: verdicts on the paper's claims (exploratory)",
        "",
        "Generated by the rule `toy_verdicts` from every seed's trajectory (`results/toy/fig*/seeds.csv.gz`).",
        "Each comparison is a paired contrast over seeds (configurations share seeds): Student's t on the",
        "per-seed differences, the exact sign test when they have no spread, exact binomial / McNemar tests for",
        f"the fraction of collapsed seeds; significant at {LEVEL:g} after Holm across the claim's comparisons and",
        f"at least its minimum effect {MIN_EFFECT}, which is also the margin of the equivalence test (TOST) that",
        "makes a comparison `absent`.",
        "Every comparison is made at each learning rate of the range (the same scale of each optimizer's lr).",
        "A claim holds only when every comparison holds at every learning rate (intersection-union), is",
        "contradicted when any is significantly reversed at any learning rate, absent when none is reversed and",
        "some is shown equivalent to no effect, else inconclusive; `per lr` gives the same rule at each scale.",
        "Thresholds are contrasted with the baseline. `dominance` is the share of the correct mass held by the",
        "larger of p(Cat), p(Persian) (0.5 balanced, 1 collapsed); its time average (`dominance_auc`) measures",
        "collapse speed. `heldout_auc` is the time average of p(Siamese | Siamese).",
        "These claims are exploratory: `results/claims.csv` carries them with role `exploratory`, outside the",
        "grid's Holm family.",
        "",
        f"Decided {note}." if note else "",
        "",
        "Setting: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
        "| claim | verdict | per lr | held | reversed | absent |",
        "|---|---|---|---|---|---|",
    ]
    for _, row in summary.iterrows():
        lines.append(
            f"| {row['statement']} | **{row['verdict']}** | {row['per_lr']} | {row['held']}/{row['tested']} | "
            f"{row['contradicted']} | {row['absent']} |"
        )
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        lines += ["", f"## {text}", "",
                  "| lr | context | comparison | metric | estimate | 95% CI | test | p (Holm) | equiv. p (Holm) "
                  "| outcome |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for _, r in sub.iterrows():
            eq = "" if pd.isna(r["p_equiv_holm"]) else f"{r['p_equiv_holm']:.2g}"
            lines.append(
                f"| x{r['lr_scale']:g} | {r['context']} | {r['comparison']} | {r['metric']} | {r['estimate']:+.3f} | "
                f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['test']} | {r['p_holm']:.2g} | {eq} | "
                f"{r['outcome']} |"
            )
    return "\n".join(lines) + "\n"
