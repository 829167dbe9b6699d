"""A verdict for each claim the paper makes about the toy figures, computed from the statistics.

Every claim is reduced to comparisons between two configurations of one figure. "A collapses
faster than B" compares the seed-mean time-averaged dominance (``dominance_auc``); a comparison
holds when the difference has the claimed sign and exceeds ``Z_MIN`` standard errors, so seed
noise alone never makes a claim hold. A claim holds when all its comparisons hold, partly when
some do.
"""

from __future__ import annotations

import math

import pandas as pd

Z_MIN = 2.0


def _row(stats: pd.DataFrame, **where) -> pd.Series:
    sub = stats
    for key, value in where.items():
        sub = sub[sub[key] == value]
    if len(sub) != 1:
        raise KeyError(f"expected one configuration for {where}, found {len(sub)}")
    return sub.iloc[0]


def _compare(
    claim: str, context: str, a: pd.Series, b: pd.Series, metric: str, a_name: str, b_name: str, larger: bool
) -> dict:
    """Does ``a[metric]`` exceed (``larger``) or fall below ``b[metric]`` by more than Z_MIN SEs?"""
    diff = float(a[metric] - b[metric])
    se = math.hypot(float(a.get(f"{metric}_se", 0.0)), float(b.get(f"{metric}_se", 0.0)))
    z = diff / se if se > 0 else (math.copysign(math.inf, diff) if diff else 0.0)
    return {
        "claim": claim,
        "context": context,
        "comparison": f"{a_name} {'>' if larger else '<'} {b_name}",
        "metric": metric,
        "left": float(a[metric]),
        "right": float(b[metric]),
        "z": z,
        "holds": bool(z > Z_MIN if larger else z < -Z_MIN),
    }


def _threshold(claim: str, context: str, row: pd.Series, metric: str, op: str, bound: float) -> dict:
    value = float(row[metric])
    holds = value >= bound if op == ">=" else value <= bound
    return {
        "claim": claim,
        "context": context,
        "comparison": f"{metric} {op} {bound}",
        "metric": metric,
        "left": value,
        "right": bound,
        "z": float("nan"),
        "holds": bool(holds),
    }


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


def comparisons(stats: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every comparison behind every claim, from the per-figure statistics."""
    rows: list[dict] = []
    auc = "dominance_auc"
    f1, f2, f3, f4, f5 = (stats[k] for k in ("fig1", "fig2", "fig3", "fig4", "fig5"))
    sizes = sorted(f1["group_size"].unique())
    g_lo, g_hi = sizes[0], sizes[-1]
    for est in f1["estimator"].unique():
        rows.append(
            _compare(
                "G",
                f"fig1 estimator={est}",
                _row(f1, estimator=est, group_size=g_lo),
                _row(f1, estimator=est, group_size=g_hi),
                auc,
                f"G={g_lo}",
                f"G={g_hi}",
                True,
            )
        )
    for g in sizes:
        for a, b in (("raw", "mean"), ("mean", "norm")):
            rows.append(
                _compare(
                    "estimators",
                    f"fig1 G={g}",
                    _row(f1, estimator=a, group_size=g),
                    _row(f1, estimator=b, group_size=g),
                    auc,
                    a,
                    b,
                    True,
                )
            )
    for name, frame in (("fig1", f1), ("fig3", f3)):
        for _, row in frame.iterrows():
            rows.append(
                _threshold(
                    "persists",
                    f"{name} estimator={row['estimator']} G={row['group_size']}",
                    row,
                    "collapsed_end",
                    ">=",
                    0.5,
                )
            )
    for g in sizes:
        for est in ("rloo", "rpp"):
            rows.append(
                _compare(
                    "advanced",
                    f"fig3 G={g}",
                    _row(f3, estimator=est, group_size=g),
                    _row(f3, estimator="raw", group_size=g),
                    auc,
                    est,
                    "raw",
                    False,
                )
            )
    for g in sizes:
        for a, b in (("high", "mid"), ("mid", "low")):
            rows.append(
                _compare(
                    "coupling",
                    f"fig2 G={g}",
                    _row(f2, siamese=a, group_size=g),
                    _row(f2, siamese=b, group_size=g),
                    "heldout_auc",
                    a,
                    b,
                    False,
                )
            )
    for sim in ("high", "mid", "low"):
        rows.append(
            _compare(
                "coupling_G",
                f"fig2 siamese={sim}",
                _row(f2, siamese=sim, group_size=g_hi),
                _row(f2, siamese=sim, group_size=g_lo),
                "heldout_auc",
                f"G={g_hi}",
                f"G={g_lo}",
                False,
            )
        )
    for g in sizes:
        for opt in ("momentum", "adamw"):
            rows.append(
                _compare(
                    "optimizers",
                    f"fig4 G={g}",
                    _row(f4, optimizer=opt, group_size=g),
                    _row(f4, optimizer="sgd", group_size=g),
                    auc,
                    opt,
                    "sgd",
                    True,
                )
            )
    for (est, opt, g), _ in f5.groupby(["estimator", "optimizer", "group_size"]):
        ctx = f"fig5 estimator={est} optimizer={opt} G={g}"
        base = _row(f5, estimator=est, optimizer=opt, group_size=g, variant="baseline")
        iac = _row(f5, estimator=est, optimizer=opt, group_size=g, variant="iac")
        both = _row(f5, estimator=est, optimizer=opt, group_size=g, variant="iac+dlc")
        rows.append(_compare("iac", ctx, iac, base, auc, "iac", "baseline", False))
        rows.append(_compare("iac_dlc", ctx, both, base, auc, "iac+dlc", "baseline", False))
        rows.append(_threshold("iac_dlc", ctx, both, "collapsed_end", "<=", 0.05))
        rows.append(_threshold("iac_dlc", ctx, both, "dominance_end", "<=", 0.9))
    return pd.DataFrame(rows)


def verdicts(comp: pd.DataFrame) -> pd.DataFrame:
    out = []
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        held = int(sub["holds"].sum())
        verdict = "holds" if held == len(sub) else ("partly holds" if held else "does not hold")
        out.append({"claim": claim, "statement": text, "verdict": verdict, "held": held, "tested": len(sub)})
    return pd.DataFrame(out)


def render_markdown(comp: pd.DataFrame, summary: pd.DataFrame, settings: dict) -> str:
    lines = [
        "# Toy experiments: verdicts on the paper's claims",
        "",
        "Generated by the rule `toy_verdicts` from `results/toy/fig*/stats.csv`. A comparison holds when the",
        f"difference has the claimed sign and exceeds {Z_MIN:g} standard errors across seeds. `dominance` is the",
        "share of the correct mass held by the larger of p(Cat), p(Persian) (0.5 balanced, 1 collapsed); its",
        "time average over training (`dominance_auc`) measures collapse speed. `heldout_auc` is the time average",
        "of p(Siamese | Siamese query).",
        "",
        "Setting: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
        "| claim | verdict | comparisons held |",
        "|---|---|---|",
    ]
    for _, row in summary.iterrows():
        lines.append(f"| {row['statement']} | **{row['verdict']}** | {row['held']}/{row['tested']} |")
    for claim, text in CLAIMS.items():
        sub = comp[comp["claim"] == claim]
        lines += [
            "",
            f"## {text}",
            "",
            "| context | comparison | metric | left | right | z | holds |",
            "|---|---|---|---|---|---|---|",
        ]
        for _, r in sub.iterrows():
            z = "" if math.isnan(r["z"]) else f"{r['z']:.1f}"
            lines.append(
                f"| {r['context']} | {r['comparison']} | {r['metric']} | {r['left']:.3f} | "
                f"{r['right']:.3f} | {z} | {'yes' if r['holds'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"
