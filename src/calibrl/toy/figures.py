"""Which toy configurations make up each of the paper's Figures 1-5, and how each is summarised.

A figure is a grid of ``ToySetting``s, each at every learning rate of the range (``lr_scales`` times the
optimizer's ``lr``, the factor ``lr_scale``); ``run_figure`` simulates them all and returns three frames:
per-seed trajectories, seed-aggregated curves (the tidy figure data) and collapse statistics.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pandas as pd

from calibrl.toy.sim import SHARED, ToySetting, simulate

FIGURES = {
    "fig1": "Effect of the advantage estimator and group size (Section 2.4, Figure 1)",
    "fig2": "Semantic coupling: held-out Siamese accuracy (Section 2.4, Figure 2)",
    "fig3": "RLOO and Reinforce++ with baseline (Appendix G, Figure 3)",
    "fig4": "Optimizers: SGD, momentum, AdamW (Appendix G, Figure 4)",
    "fig5": "IAC and IAC + DLC (Appendix H, Figure 5)",
}
VARIANTS = {"baseline": (0.0, 0.0), "iac": (1.0, 0.0), "iac+dlc": (1.0, 1.0)}  # scaled by config below
FACTOR_COLUMNS = ("estimator", "optimizer", "variant", "siamese", "group_size", "lr_scale")
NUMERIC_FACTORS = ("group_size", "lr_scale")
COLLAPSE_LEVELS = (0.9, 0.99)


def lr_scales(cfg: dict) -> list[float]:
    """The learning-rate range: each optimizer's ``lr`` times each of these (``toy.lr_scales``; the schema fills in
    its default)."""
    return [float(x) for x in cfg["lr_scales"]]


def toy_setting(cfg: dict, **overrides) -> ToySetting:
    """The configuration the ``toy`` section ``cfg`` (defaults filled in) describes, with ``overrides``; its
    learning rate is its optimizer's (SGD unless overridden) unless ``lr`` is among them."""
    base = dict(
        estimator=cfg["estimator"],
        steps=cfg["steps"],
        seeds=cfg["seeds"],
        seed=cfg["seed"],
        init=cfg["init"],
        memory_lr=cfg["memory_lr"],
        momentum=cfg["momentum"],
        weight_decay=cfg["weight_decay"],
        record_every=cfg["record_every"],
    )
    base.update(overrides)
    optimizer = base.get("optimizer", ToySetting.optimizer)
    if optimizer not in cfg["lr"]:
        raise ValueError(f"optimizer must be one of {tuple(cfg['lr'])}, got {optimizer!r}")
    base.setdefault("lr", cfg["lr"][optimizer])
    return ToySetting(**base)


def figure_settings(figure: str, cfg: dict) -> Iterator[tuple[dict, ToySetting]]:
    """Yield ``(factors, setting)`` for every configuration of ``figure`` under the ``toy`` config, at every
    learning rate of the range (factor ``lr_scale``: the setting's lr is that times its optimizer's ``lr``)."""
    for factors, setting in _base_settings(figure, cfg):
        for scale in lr_scales(cfg):
            yield {**factors, "lr_scale": scale}, replace(setting, lr=setting.lr * scale)


def _base_settings(figure: str, cfg: dict) -> Iterator[tuple[dict, ToySetting]]:
    sizes = cfg["group_sizes"]
    if figure == "fig1":
        for est, g in itertools.product(("raw", "mean", "norm"), sizes):
            yield {"estimator": est, "group_size": g}, toy_setting(cfg, estimator=est, group_size=g)
    elif figure == "fig2":
        for sim, g in itertools.product(("high", "mid", "low"), sizes):
            yield {"siamese": sim, "group_size": g}, toy_setting(cfg, siamese=sim, group_size=g)
    elif figure == "fig3":
        for est, g in itertools.product(("raw", "rloo", "rpp"), sizes):
            yield {"estimator": est, "group_size": g}, toy_setting(cfg, estimator=est, group_size=g)
    elif figure == "fig4":
        for opt, g in itertools.product(("sgd", "momentum", "adamw"), sizes):
            yield {"optimizer": opt, "group_size": g}, toy_setting(cfg, optimizer=opt, group_size=g)
    elif figure == "fig5":
        for est, opt, variant, g in itertools.product(cfg["fig5_estimators"], cfg["fig5_optimizers"], VARIANTS, sizes):
            use_iac, use_dlc = VARIANTS[variant]
            factors = {"estimator": est, "optimizer": opt, "variant": variant, "group_size": g}
            yield (
                factors,
                toy_setting(
                    cfg,
                    estimator=est,
                    optimizer=opt,
                    group_size=g,
                    iac_alpha=use_iac * cfg["iac_alpha"],
                    dlc_mu=use_dlc * cfg["dlc_mu"],
                ),
            )
    else:
        raise ValueError(f"unknown toy figure {figure!r}; choose one of {sorted(FIGURES)}")


def dominance(frame: pd.DataFrame) -> pd.Series:
    """Share of the correct mass held by the larger correct label: 0.5 = balanced, 1 = collapsed."""
    correct = frame["p_cat"] + frame["p_persian"]
    return np.maximum(frame["p_cat"], frame["p_persian"]) / correct


def collapse_stats(traj: pd.DataFrame, steps: int) -> dict:
    """Seed-level collapse statistics of one configuration's trajectories.

    ``dominance_auc`` is each seed's time-averaged dominance (higher = faster collapse), reported as
    the mean over seeds with its standard error, so that two configurations can be compared
    beyond seed noise. ``t90``/``t99`` are the first recorded steps at which one correct label
    holds 90% / 99% of the correct mass; the median is NaN when fewer than half the seeds got
    there (then ``reached90`` < 0.5 says so).
    """
    frame = traj.assign(dominance=dominance(traj))
    per_seed = frame.groupby("seed")
    auc = per_seed["dominance"].mean()
    last = frame[frame["step"] == frame["step"].max()].set_index("seed")
    out = {
        "seeds": int(auc.size),
        "dominance_auc": float(auc.mean()),
        "dominance_auc_se": float(auc.std(ddof=1) / np.sqrt(auc.size)) if auc.size > 1 else 0.0,
        "dominance_end": float(last["dominance"].mean()),
        "collapsed_end": float((last["dominance"] >= 0.99).mean()),
        "cat_won": float((last["p_cat"] > last["p_persian"]).mean()),
        "correct_mass_end": float((last["p_cat"] + last["p_persian"]).mean()),
        "min_correct_label_end": float(np.minimum(last["p_cat"], last["p_persian"]).mean()),
    }
    for level in COLLAPSE_LEVELS:
        hit = frame[frame["dominance"] >= level].groupby("seed")["step"].min()
        first = hit.reindex(auc.index).to_numpy(dtype=float)
        reached = np.isfinite(first)
        tag = f"{round(level * 100)}"
        out[f"reached{tag}"] = float(reached.mean())
        median = float(np.quantile(np.where(reached, first, np.inf), 0.5, method="lower"))
        out[f"t{tag}_median"] = median if np.isfinite(median) else float("nan")
    if "p_siamese_heldout" in frame:
        held = per_seed["p_siamese_heldout"].mean()
        out["heldout_auc"] = float(held.mean())
        out["heldout_auc_se"] = float(held.std(ddof=1) / np.sqrt(held.size)) if held.size > 1 else 0.0
        out["heldout_end"] = float(last["p_siamese_heldout"].mean())
        out["heldout_start"] = float(frame.loc[frame["step"] == 0, "p_siamese_heldout"].mean())
    return out


def curves(traj: pd.DataFrame) -> pd.DataFrame:
    """Seed-aggregated curves, long format: one row per (step, quantity) with mean, q10, q90.

    ``p_winner``/``p_loser`` are the correct label that ends ahead in each seed and the other one,
    the view in which collapse shows (the raw p_cat / p_persian means stay near symmetric because
    which label wins is random).
    """
    frame = traj.sort_values(["seed", "step"], kind="stable")
    steps = np.sort(frame["step"].unique())
    n_seeds = frame["seed"].nunique()
    if len(frame) != n_seeds * len(steps):
        raise ValueError("curves needs every seed recorded at the same steps")
    shape = (n_seeds, len(steps))
    values = {c: frame[c].to_numpy(dtype=float).reshape(shape) for c in frame.columns if c.startswith("p_")}
    cat, persian = values["p_cat"], values["p_persian"]
    cat_wins = (cat[:, -1] >= persian[:, -1])[:, None]
    values["p_winner"] = np.where(cat_wins, cat, persian)
    values["p_loser"] = np.where(cat_wins, persian, cat)
    values["dominance"] = np.maximum(cat, persian) / (cat + persian)
    names = sorted(values)  # the order of a groupby on (step, quantity)
    cube = np.stack([values[q] for q in names], axis=-1)  # (seeds, steps, quantities)
    q10, q90 = np.quantile(cube, [0.1, 0.9], axis=0)
    return pd.DataFrame(
        {
            "step": np.repeat(steps, len(names)),
            "quantity": np.tile(names, len(steps)),
            "mean": cube.mean(axis=0).ravel(),
            "q10": q10.ravel(),
            "q90": q90.ravel(),
        }
    )


def run_figure(figure: str, cfg: dict, progress=None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Simulate every configuration of ``figure``: (per-seed trajectories, curves, statistics).

    Configurations that can share a simulation (``sim.SHARED``, and the same optimizer family: AdamW's state is
    not SGD's) are simulated together; each is the same as simulated alone (``sim.simulate``)."""
    items = list(figure_settings(figure, cfg))
    batches: dict[tuple, list[int]] = {}
    for i, (_, setting) in enumerate(items):
        key = tuple(getattr(setting, f) for f in SHARED) + (setting.optimizer == "adamw",)
        batches.setdefault(key, []).append(i)
    frames: dict[int, pd.DataFrame] = {}
    for rows in batches.values():
        frames.update(zip(rows, simulate([items[i][1] for i in rows])))
        if progress:
            for i in rows:
                progress(items[i][0])
    trajs, curve_frames, stats = [], [], []
    for i, (factors, setting) in enumerate(items):
        traj = frames.pop(i)
        cols = {k: factors.get(k, "") for k in FACTOR_COLUMNS}
        trajs.append(traj.assign(**cols))
        curve_frames.append(curves(traj).assign(**cols))
        stats.append(
            {
                **cols,
                **collapse_stats(traj, setting.steps),
                "lr": setting.lr,
                "iac_alpha": setting.iac_alpha,
                "dlc_mu": setting.dlc_mu,
            }
        )
    order = list(FACTOR_COLUMNS)
    traj_all = pd.concat(trajs, ignore_index=True)
    traj_all = traj_all[order + [c for c in traj_all.columns if c not in order]]
    curves_all = pd.concat(curve_frames, ignore_index=True)
    curves_all = curves_all[order + [c for c in curves_all.columns if c not in order]]
    return traj_all, curves_all, pd.DataFrame(stats)


def read_table(path) -> pd.DataFrame:
    """Read a toy CSV back with its factor columns as strings ('' where a factor does not apply)."""
    frame = pd.read_csv(path)
    for col in FACTOR_COLUMNS:
        if col in frame and col not in NUMERIC_FACTORS:
            frame[col] = frame[col].fillna("").astype(str)
    return frame
