"""Aggregation of the grid into the paper's tables and figures (Tables 2-5, Figure 6), read from files only.

The paper evaluates a checkpoint every 50 steps and reports each method's peak. We take the peak over
checkpoints per cell (benchmark x metric), and for the "Avg." column the peak of the per-checkpoint
average, which is the most literal reading. Best and second best per column are marked as in the paper
(bold, underline).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from calibrl.io import atomic_path, write_csv, write_text  # noqa: E402

log = logging.getLogger("calibrl.report")
def metrics(grid: dict) -> dict[str, str]:
    """Metric keys of the evaluation files and their table labels, e.g. avg_at_8 -> AVG@8."""
    k = grid["eval"]["k"]
    return {f"avg_at_{k}": f"AVG@{k}", f"pass_at_{k}": f"PASS@{k}"}


# ------------------------------------------------------------------------------------------ loading
def load_evals(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    """Long frame (model, method, seed, step, split, metric, value) from ``runs/{model}/{method}/s{seed}/eval``."""
    rows = []
    for path in paths:
        path = Path(path)
        rel = path.resolve().relative_to(Path(root).resolve())
        model, method, seed = rel.parts[-5], rel.parts[-4], int(rel.parts[-3][1:])
        data = json.loads(path.read_text())
        for split, metrics in data["splits"].items():
            for metric, value in metrics.items():
                rows.append((model, method, seed, int(data["step"]), split, metric, float(value)))
    return pd.DataFrame(rows, columns=["model", "method", "seed", "step", "split", "metric", "value"])


def load_train_metrics(paths: list[str | Path], root: str | Path) -> pd.DataFrame:
    frames = []
    for path in paths:
        path = Path(path)
        rel = path.resolve().relative_to(Path(root).resolve())
        model, method, seed = rel.parts[-4], rel.parts[-3], int(rel.parts[-2][1:])
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        frames.append(pd.DataFrame(lines).assign(model=model, method=method, seed=seed))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ------------------------------------------------------------------------------------------- tables
def peak_table(evals: pd.DataFrame, metric: str, seed: int) -> pd.DataFrame:
    """(model, method) x split peak values of ``metric`` in percent, plus the peak of the average."""
    sub = evals[(evals["metric"] == metric) & (evals["seed"] == seed)]
    per_ckpt = sub.pivot_table(index=["model", "method", "step"], columns="split", values="value")
    per_ckpt["Avg."] = per_ckpt.mean(axis=1)
    return (per_ckpt.groupby(level=["model", "method"]).max() * 100).round(2)


def _marks(frame: pd.DataFrame, group: str | None, row_wise: bool = False) -> pd.DataFrame:
    """'best'/'second' marks per column (within each ``group`` of rows), or per row."""
    if row_wise:
        return _marks(frame.T, None).T
    marks = pd.DataFrame("", index=frame.index, columns=frame.columns)
    groups = [frame] if group is None else [g for _, g in frame.groupby(level=group, sort=False)]
    for g in groups:
        for col in g.columns:
            ranked = g[col].rank(ascending=False, method="min")
            marks.loc[ranked[ranked == 1].index, col] = "best"
            marks.loc[ranked[ranked == 2].index, col] = "second"
    return marks


def to_markdown(frame: pd.DataFrame, title: str, group: str | None = None, row_wise: bool = False) -> str:
    marks = _marks(frame, group, row_wise)
    idx_names = [n or "" for n in frame.index.names]
    lines = [
        f"### {title}",
        "",
        "| " + " | ".join(idx_names + list(frame.columns)) + " |",
        "|" + "---|" * (len(idx_names) + len(frame.columns)),
    ]
    for key, row in frame.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        cells = []
        for col, value in row.items():
            text = f"{value:.2f}"
            mark = marks.loc[key if len(key) > 1 else key[0], col]
            cells.append(f"**{text}**" if mark == "best" else f"<u>{text}</u>" if mark == "second" else text)
        lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
    lines.append("")
    where = "row" if row_wise else "column" + (f" within each {group}" if group else "")
    lines.append(f"Peak over checkpoints, percent; **best**, <u>second best</u> per {where}.")
    return "\n".join(lines) + "\n"


def _ordered(frame: pd.DataFrame, models: list[str], methods: list[str]) -> pd.DataFrame:
    """Rows in config order: each model's block, its methods in the table's order."""
    rows = [(mo, me) for mo in models for me in methods if (mo, me) in frame.index]
    return frame.loc[rows]


def build_tables(evals: pd.DataFrame, grid: dict) -> dict[str, pd.DataFrame]:
    seed, main, tables = grid["seed"], grid["main_model"], grid["tables"]
    out = {}
    avg, pas = metrics(grid)
    for metric, name in ((avg, "table2"), (pas, "table3")):
        out[name] = _ordered(peak_table(evals, metric, seed), list(grid["models"]), tables["table2_3"])
    t4 = []
    for metric, label in metrics(grid).items():
        peaks = peak_table(evals, metric, seed).loc[main]
        t4.append(peaks.loc[[m for m in tables["table4"] if m in peaks.index]].assign(metric=label))
    out["table4"] = pd.concat(t4).reset_index().set_index(["metric", "method"])
    t5 = []
    for metric, label in metrics(grid).items():
        peaks = peak_table(evals, metric, seed).loc[main]
        cols = [m for m in tables["table5"] if m in peaks.index]
        t5.append(peaks.loc[cols].T.assign(metric=label).reset_index().rename(columns={"split": "dataset"}))
    out["table5"] = pd.concat(t5).set_index(["metric", "dataset"])
    return out


# ------------------------------------------------------------------------------------------ figures
def plot_over_steps(
    frame: pd.DataFrame, value: str, by: str, title: str, ylabel: str, path: str | Path, panels: str | None = None
) -> None:
    keys = [None] if panels is None else list(dict.fromkeys(frame[panels]))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        sub = frame if key is None else frame[frame[panels] == key]
        for name, line in sub.groupby(by, sort=False):
            line = line.sort_values("step")
            ax.plot(line["step"], line[value], marker="o" if len(line) < 30 else None, ms=3, label=str(name))
        ax.set_title(title if key is None else f"{title}: {key}", fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def figure6(train: pd.DataFrame, grid: dict) -> pd.DataFrame:
    """Entropy over steps for the Figure 6 methods on the main model (smoothed over 5 steps for reading)."""
    sub = train[
        (train["model"] == grid["main_model"])
        & (train["seed"] == grid["seed"])
        & (train["method"].isin(grid["tables"]["figure6"]))
    ]
    sub = sub[["method", "step", "entropy"]].sort_values(["method", "step"]).copy()
    sub["entropy_smoothed"] = sub.groupby("method")["entropy"].transform(lambda s: s.rolling(5, min_periods=1).mean())
    return sub


# ------------------------------------------------------------------------------------------ summary
def orderings(tables: dict[str, pd.DataFrame], evals: pd.DataFrame, fig6: pd.DataFrame, grid: dict) -> list[dict]:
    """The paper's orderings, checked on our numbers; each with the numbers it rests on."""
    checks = []

    def add(claim, holds, detail):
        checks.append({"claim": claim, "holds": bool(holds), "detail": detail})

    for name, label in zip(("table2", "table3"), metrics(grid).values()):
        t = tables[name]
        for model in t.index.get_level_values("model").unique():
            block = t.loc[model, "Avg."]
            if "iac" in block and "grpo" in block:
                add(
                    f"IAC above GRPO on {label} (average), {model}",
                    block["iac"] > block["grpo"],
                    f"iac {block['iac']:.2f} vs grpo {block['grpo']:.2f}",
                )
            baselines = block.drop(labels=["iac"], errors="ignore")
            if "iac" in block and len(baselines):
                add(
                    f"IAC best of Tables 2/3 methods on {label} (average), {model}",
                    block["iac"] >= baselines.max(),
                    f"iac {block['iac']:.2f}, best baseline {baselines.idxmax()} {baselines.max():.2f}",
                )
    t4 = tables["table4"]
    for label in metrics(grid).values():
        if label in t4.index.get_level_values("metric"):
            block = t4.loc[label, "Avg."]
            if "dapo_iac_dlc" in block:
                add(
                    f"DAPO+IAC+DLC best in Table 4 ({label}, average)",
                    block["dapo_iac_dlc"] >= block.max(),
                    ", ".join(f"{m} {v:.2f}" for m, v in block.items()),
                )
            if "dapo_iac" in block and "dapo" in block:
                add(
                    f"DAPO+IAC above DAPO ({label}, average)",
                    block["dapo_iac"] > block["dapo"],
                    f"dapo_iac {block['dapo_iac']:.2f} vs dapo {block['dapo']:.2f}",
                )
    t5 = tables["table5"]
    for label in metrics(grid).values():
        if label in t5.index.get_level_values("metric"):
            block = t5.loc[(label, "Avg.")]
            alphas = block.drop(labels=["filter"], errors="ignore")
            add(
                f"Table 5 ({label}, average): alpha optimum is interior (0 < alpha < 2)",
                alphas.idxmax() not in ("grpo", "iac_a2"),
                ", ".join(f"{m} {v:.2f}" for m, v in block.items()),
            )
            if "filter" in block and "iac" in block:
                add(
                    f"Filtering below IAC ({label})",
                    block["filter"] < block["iac"],
                    f"filter {block['filter']:.2f} vs iac {block['iac']:.2f}",
                )
    if not fig6.empty and {"dapo", "dapo_iac"} <= set(fig6["method"]):
        last = fig6[fig6["step"] > fig6["step"].max() * 0.75].groupby("method")["entropy"].mean()
        add(
            "Entropy kept higher under DAPO+IAC than DAPO (last quarter of training)",
            last["dapo_iac"] > last["dapo"],
            f"dapo_iac {last['dapo_iac']:.3f} vs dapo {last['dapo']:.3f} nats",
        )
    return checks


def noise_table(evals: pd.DataFrame, grid: dict) -> pd.DataFrame:
    """Seed spread of the average peak for methods run with several seeds (main model)."""
    rows = []
    for metric, label in metrics(grid).items():
        for seed in sorted(evals["seed"].unique()):
            peaks = peak_table(evals, metric, seed)
            for (model, method), value in peaks["Avg."].items():
                rows.append({"metric": label, "model": model, "method": method, "seed": seed, "avg": value})
    frame = pd.DataFrame(rows)
    multi = frame.groupby(["metric", "model", "method"])["seed"].transform("nunique") > 1
    return frame[multi].pivot_table(index=["metric", "model", "method"], columns="seed", values="avg")


def render_summary(checks: list[dict], noise: pd.DataFrame, grid: dict) -> str:
    lines = [
        "# Miniature grid: which of the paper's orderings held",
        "",
        f"Models {list(grid['models'])}, {grid['train']['steps']} steps, checkpoints every "
        f"{grid['train']['eval_every']}, G={grid['train']['group_size']}, "
        f"{grid['train']['prompts_per_step']} prompts per step; splits {grid['data']['eval_splits']}. "
        "Values are peak percentages over checkpoints.",
        "",
        "| ordering | holds | numbers |",
        "|---|---|---|",
    ]
    for c in checks:
        lines.append(f"| {c['claim']} | {'yes' if c['holds'] else 'no'} | {c['detail']} |")
    held = sum(c["holds"] for c in checks)
    lines += ["", f"{held} of {len(checks)} orderings held.", ""]
    if not noise.empty:
        lines += [
            "## Seed noise",
            "",
            "Average peak (percent) per seed for the methods run with several seeds. A difference between "
            "methods smaller than the spread between seeds is not distinguishable.",
            "",
            noise.round(2).to_markdown() if hasattr(noise, "to_markdown") else noise.round(2).to_string(),
            "",
        ]
        spread = noise.max(axis=1) - noise.min(axis=1)
        lines.append(f"Largest seed spread: {spread.max():.2f} points; mean: {spread.mean():.2f} points.")
    return "\n".join(lines) + "\n"


def write_tables(tables: dict[str, pd.DataFrame], out_dir: str | Path, grid: dict) -> dict[str, Path]:
    avg, pas = metrics(grid).values()
    titles = {
        "table2": f"Table 2: {avg} (%)",
        "table3": f"Table 3: {pas} (%)",
        "table4": "Table 4: compatibility with DAPO (main model)",
        "table5": "Table 5: sensitivity to alpha (grpo = alpha 0, iac = alpha 1) and filtering",
    }
    groups = {"table2": "model", "table3": "model", "table4": "metric", "table5": None}
    paths = {}
    for name, frame in tables.items():
        out = Path(out_dir)
        write_csv(out / f"{name}.csv", frame.reset_index())
        write_text(out / f"{name}.md", to_markdown(frame, titles[name], groups[name], row_wise=name == "table5"))
        paths[name] = out / f"{name}.md"
    return paths
