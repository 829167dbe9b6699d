"""The grid's MLflow view (rule grid_mlflow), rebuilt from the result files; idempotent (runs keyed by
``calibrl.key``).

Experiments, so that no chart mixes kinds of runs: ``{experiment}-grid`` holds one run per (model, method, seed),
tagged ``method``/``model``/``seed``, so grouping the runs table by the ``method`` tag draws each method's seed mean
with its band in MLflow's own charts; ``{experiment}-claims`` holds one run per claim (metrics estimate, ci_low,
ci_high, seeds, p, p_holm, p_equiv; tags role, verdict, plan_sha256) and a ``tables and figures`` run with every
table, figure, claims.csv and the summary. The toy keeps the config's experiment (``calibrl.toy.jobs.mlflow_job``).

MLflow 3's UI opens an experiment in the GenAI view unless the page's ``workflowType`` is ``machine_learning``
(query parameter, else the browser's saved choice): the links written to ``grid_mlflow.json`` carry it; the
experiments are also tagged model-development (``calibrl.tracking``) for UIs that read the tag.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from calibrl.analysis_plan import BASE
from calibrl.io import outputs, write_json
from calibrl.report import load as L
from calibrl.runs import Run

log = logging.getLogger("calibrl.report")

VIEW = "workflowType=machine_learning"


def experiments(experiment: str) -> dict[str, str]:
    """The config's experiment name -> the experiment of each part (the toy keeps the config's name)."""
    return {"grid": f"{experiment}-grid", "claims": f"{experiment}-claims", "toy": experiment}


def _times(tr: pd.DataFrame) -> dict:
    """The training's real start and end (ms) from its metrics' wall clock (``time`` at each step's end, less
    the step's ``seconds`` for the first); none where the trainer does not record it."""
    if tr.empty or "time" not in tr or tr["time"].isna().all():
        return {}
    tr = tr.dropna(subset=["time"]).sort_values("step")
    first = tr.iloc[0]
    return {"start_ms": int((first["time"] - first.get("seconds", 0.0)) * 1000), "end_ms": int(tr["time"].max() * 1000)}


def run_records(grid: dict, evals: pd.DataFrame, train: pd.DataFrame, out: Path, architectures: dict) -> list:
    """One record per (model, method, seed) with evaluations or training metrics: the run's own settings as params
    (its compiled method, the shared training and evaluation settings; not the grid's other methods or tables), its
    evaluation curves with the base model at step 0 (every run starts from it), its training metrics, and its own
    files as artifacts. The live view (calibrl.live) logs the same records from the files that exist so far."""
    from calibrl.tracking import RunRecord, flatten

    shared = flatten({"train": grid["train"], "eval": grid["eval"]}, "grid")
    skip = {"model", "method", "seed", "step", "seconds", "time"}
    base = evals[evals["method"] == BASE]
    keys = ["model", "method", "seed"]
    if train.empty:  # a run evaluated before any training step is logged (the live view's first rounds)
        train = pd.DataFrame(columns=[*keys, "step"])
    runs = pd.concat([evals[keys], train[keys]]).drop_duplicates()
    records = []
    for model, method, seed in sorted(runs.itertuples(index=False, name=None)):
        sub = evals[(evals["model"] == model) & (evals["method"] == method) & (evals["seed"] == seed)]
        m = grid["methods"].get(method, {})  # the compiled spec (MethodSpec.to_dict); none for the base model
        start = base[(base["model"] == model) & (base["seed"] == seed)] if method != BASE else base.iloc[:0]
        metrics = [(f"eval/{r.split}/{r.metric}", r.value, r.step) for r in pd.concat([start, sub]).itertuples()]
        tr = train[(train["model"] == model) & (train["method"] == method) & (train["seed"] == seed)]
        for col in [c for c in tr.columns if c not in skip and pd.api.types.is_numeric_dtype(tr[c])]:
            metrics += [(f"train/{col}", v, s) for s, v in zip(tr["step"], tr[col]) if v == v]
        tables = [t for t, names in grid["tables"].items() if method in names]
        run = Run(model, method, seed).path
        own = [out / "runs" / run / name for name in ("settings.json", "metrics.jsonl")]
        logs = sorted((out / "logs" / "train" / run).glob("*.log"))
        records.append(
            RunRecord(
                key=f"grid/{run}",
                name=f"{method} s{seed} ({model})",
                params={
                    "model": model,
                    "method": method,
                    "seed": seed,
                    **m,
                    **{f"arch.{k}": v for k, v in architectures.get(model, {}).items()},
                    **shared,
                },
                tags={
                    "part": "grid",
                    "model": model,
                    "method": method,
                    "alpha": m.get("iac_alpha", ""),
                    "mu": m.get("dlc_mu", ""),
                    "seed": seed,
                    "table": ",".join(tables),
                    "trainer": grid["trainer"],
                },
                metrics=metrics,
                artifacts=[(p, "run") for p in own if p.is_file()] + [(p, "logs") for p in logs],
                **_times(tr),
            )  # fmt: skip
        )
    return records


def _claim_records(claims: pd.DataFrame, written_ms: int) -> list:
    """One run per claim. MLflow lists runs newest first: each claim's start is ``written_ms`` (when claims.csv
    was written) less a second per row, so the UI lists them as claims.csv does, the primaries first."""
    from calibrl.tracking import RunRecord

    records = []
    for i, r in enumerate(claims.itertuples()):
        values = {"estimate": r.estimate, "ci_low": r.ci_low, "ci_high": r.ci_high, "seeds": r.seeds, "p": r.p,
                  "p_holm": r.p_holm, "p_equiv": r.p_equiv, "p_equiv_holm": r.p_equiv_holm}  # fmt: skip
        records.append(
            RunRecord(
                key=f"claims/{r.claim}",
                name=f"{r.verdict}: {r.claim}"[:250],
                params={"claim": r.claim, "source": r.source, "quantity": r.quantity},
                tags={
                    "part": "claims",
                    "role": r.role,
                    "verdict": r.verdict,
                    "source": r.source,
                    "order": i,
                    "plan_sha256": r.plan_sha256 if pd.notna(r.plan_sha256) else "",
                },
                metrics=[(k, float(v), 0) for k, v in values.items() if pd.notna(v)],
                start_ms=written_ms - 1000 * i,
                end_ms=written_ms - 1000 * i,
            )
        )
    return records


def sync_grid_mlflow(
    grid: dict,
    eval_paths: list[str],
    metric_paths: list[str],
    root: str,
    store_dir: str,
    experiment: str,
    runs_json: str | None = None,
    architectures: dict | None = None,
) -> dict:
    """The grid's and the claims' MLflow experiments from the result files under ``root``; returns run ids.

    ``architectures``: {model: settings} logged as ``arch.*`` params (the tiny models' shapes)."""
    from calibrl.tracking import RunRecord, Store

    out = Path(root)
    store = Store(store_dir)  # fails here, before any write, if the store is locked or corrupted
    names = experiments(experiment)
    evals = L.load_evals(eval_paths, root)
    train = L.load_train_metrics(metric_paths, root)
    run_ids = {}
    for record in run_records(grid, evals, train, out, architectures or {}):
        run_ids[record.key] = store.upsert(names["grid"], record)
    claims_csv = out / "claims.csv"
    written = int(claims_csv.stat().st_mtime * 1000) if claims_csv.is_file() else 0
    claims = pd.read_csv(claims_csv) if claims_csv.is_file() else pd.DataFrame()
    for record in _claim_records(claims, written):
        run_ids[record.key] = store.upsert(names["claims"], record)
    artifacts = [(p, "tables") for p in outputs(out / "tables")]
    artifacts += [(p, "figures") for p in sorted((out / "figures").glob("*.png"))]
    artifacts += [(out / name, "summary") for name in ("summary.md", "claims.csv") if (out / name).is_file()]
    after = written - 1000 * len(claims)  # listed after the claims
    tables = RunRecord(key="grid/tables", name="tables and figures", tags={"part": "report"}, artifacts=artifacts,
                       start_ms=after if written else None, end_ms=after if written else None)  # fmt: skip
    run_ids["tables"] = store.upsert(names["claims"], tables)
    # results no longer there (a deleted run folder, a method or claim dropped) leave the UI's lists
    store.prune(names["grid"], {k for k in run_ids if k.startswith("grid/")})
    store.prune(names["claims"], {k for k in run_ids if k.startswith("claims/")} | {tables.key})
    log.info("logged %d runs to %s (experiments %s)", len(run_ids), store.uri, list(names.values())[:2])
    if runs_json:
        ids = {k: store.experiment(v) for k, v in names.items() if k != "toy"}
        write_json(
            runs_json,
            {"experiments": names, "tracking_uri": store.uri, "runs": run_ids,
             "open": {k: f"/#/experiments/{i}?{VIEW}" for k, i in ids.items()}},
        )  # fmt: skip
    return run_ids
