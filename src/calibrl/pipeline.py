"""The grid's jobs as the workflow runs them: data, warm start, training, evaluation.

Each function takes plain values (paths and config sections), so a rule's script is one call and the
same job can be run by hand or from a test.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from calibrl import grid as G
from calibrl.data import countdown
from calibrl.data.records import Records, read_jsonl, write_jsonl
from calibrl.io import outputs, write_json

log = logging.getLogger("calibrl.pipeline")


def _threads(n: int) -> None:
    """Each job uses its own cores only: Snakemake runs several jobs side by side."""
    torch.set_num_threads(max(1, int(n)))


def _on_error(data: dict) -> str:
    """``grid.data.on_error``; the schema fills in its default (fail), this is for configs built in code."""
    return data.get("on_error", "fail")


def _read(grid: dict, path: str) -> Records:
    return read_jsonl(path, on_error=_on_error(grid["data"]))


def data_job(data: dict, out_paths: dict[str, str], manifest: str) -> None:
    """Generate the synthetic splits (``calibrl.data.countdown``), with a manifest of what was made."""
    entries = {}
    for split, path in out_paths.items():
        records = countdown.generate(split, data["splits"][split], data["seed"])
        write_jsonl(path, records)
        sols = [len(r["verifier"]["solutions"]) for r in records]
        entries[split] = {
            "path": str(path),
            "rows": len(records),
            "mean_solutions": sum(sols) / len(sols),
            "multi_solution_share": sum(s >= 2 for s in sols) / len(sols),
        }
        log.info("%s: %s", split, entries[split])
    write_json(
        manifest, {"source": "countdown (synthetic, calibrl.data.countdown)", "seed": data["seed"], "splits": entries}
    )


def architecture(grid: dict, model: str) -> dict:
    archs = {**grid["models"], **grid.get("memory_models", {})}
    return {k: v for k, v in archs[model].items() if k != "memory"}


def warmstart_job(grid: dict, model: str, train_path: str, model_dir: str, info_path: str, threads: int = 1) -> None:
    from calibrl.train.warmstart import warmstart

    _threads(threads)
    records = _read(grid, train_path)
    ws = grid["warmstart"]
    info = warmstart(
        records,
        architecture(grid, model),
        ws["steps"],
        ws["batch_size"],
        ws["lr"],
        grid["seed"],
        grid["prompt_template"],
        model_dir,
    )
    write_json(info_path, {**info, "model": model, "path": str(Path(model_dir).resolve())})


def train_settings(grid: dict):
    from calibrl.train.local import TrainSettings

    return TrainSettings(**grid["train"])


def train_job(
    grid: dict,
    model: str,
    method: str,
    seed: int,
    train_path: str,
    init_info: str | None,
    run_dir: str,
    memory_info: str | None = None,
    threads: int = 1,
    success_path: str | None = None,
) -> None:
    """Train one (model, method, seed) run to ``grid.train.steps``, resuming from its last checkpoint.

    ``success_path``: at paper scale, the filtering baseline's success rates (``rank_job``)."""
    from calibrl.tasks import Scorer
    from calibrl.train.local import Trainer

    if grid["trainer"] == "openrlhf":
        return openrlhf_train_job(grid, model, method, seed, train_path, run_dir, success_path)
    _threads(threads)
    m = G.method({"grid": grid}, method)
    records = _read(grid, train_path)
    init_dir = json.loads(Path(init_info).read_text())["path"]
    memory_dir = json.loads(Path(memory_info).read_text())["path"] if memory_info else None
    with Scorer(workers=grid.get("workers", 1)) as scorer:
        trainer = Trainer(
            m,
            train_settings(grid),
            records,
            init_dir,
            run_dir,
            scorer,
            seed=seed,
            memory_dir=memory_dir,
            template=grid["prompt_template"],
        )
        trainer.run()


def evaluate_job(
    grid: dict,
    markers: list[str],
    split_paths: dict[str, str],
    out_paths: list[str],
    steps: list[int],
    threads: int = 1,
) -> None:
    """Evaluate each checkpoint (``markers[i]`` -> ``out_paths[i]``, step ``steps[i]``).

    The splits are read once and one set of grading workers serves every checkpoint; each result is the
    one the checkpoint gets when evaluated alone (sampling is seeded per checkpoint)."""
    from calibrl.tasks import Scorer

    if not len(markers) == len(out_paths) == len(steps):
        raise ValueError(f"{len(markers)} markers, {len(out_paths)} outputs and {len(steps)} steps")
    _threads(threads)
    splits = {name: _read(grid, path) for name, path in split_paths.items()}
    with Scorer(workers=grid.get("workers", 1)) as scorer:
        for marker, out_path, step in zip(markers, out_paths, steps):
            policy_dir = json.loads(Path(marker).read_text())["policy"]
            log.info("checkpoint step %d: %s", step, policy_dir)
            results = _evaluate_checkpoint(grid, policy_dir, splits, scorer.grades)
            write_json(out_path, {"step": step, "policy": policy_dir, "splits": results})


def _evaluate_checkpoint(grid: dict, policy_dir: str, splits: dict[str, list[dict]], grade) -> dict:
    """One checkpoint on every split: the CPU sampler, or (paper scale) every split in one vLLM engine."""
    ev = grid["eval"]
    sampling = (ev["n"], ev["k"], ev["temperature"], ev["top_p"], ev["max_new_tokens"], grid["prompt_template"])
    if grid["evaluator"] == "vllm":
        from calibrl.evaluate_vllm import evaluate_checkpoint

        return evaluate_checkpoint(
            policy_dir,
            splits,
            grade,
            *sampling,
            bool(grid.get("chat_template")),
            grid["seed"],
            tensor_parallel_size=int(ev.get("tensor_parallel_size", 1)),
            max_prompt_len=int(grid["train"]["max_prompt_len"]),
        )
    from calibrl.evaluate import evaluate_policy
    from calibrl.models import load

    policy, tokenizer = load(policy_dir)
    return evaluate_policy(policy, tokenizer, splits, grade, *sampling, seed=grid["seed"])


def aggregate_job(
    grid: dict,
    eval_paths: list[str],
    metric_paths: list[str],
    root: str,
    out_dir: str,
    store_dir: str,
    experiment: str,
    done_path: str,
) -> None:
    """Tables 2-5 beside the paper's, Figure 6, plots and the orderings summary from the result files.

    ``store_dir`` None leaves MLflow alone: the workflow syncs it in its own rule (``_sync_grid_mlflow``), so
    that a broken store fails that rule only and never costs the tables.
    """
    from calibrl import report as R

    out = Path(out_dir)
    evals = R.load_evals(eval_paths, root)
    train = R.load_train_metrics(metric_paths, root)
    tables = R.build_tables(evals, grid)
    R.write_tables(tables, out / "tables", grid)
    fig6 = R.figure6(train, grid)
    from calibrl.io import write_csv

    write_csv(out / "tables" / "figure6_entropy.csv", fig6)
    checks, matched = R.write_beside(tables, fig6, out / "tables", grid)
    R.plot_over_steps(
        fig6,
        "entropy_smoothed",
        "method",
        "Figure 6: policy entropy (5-step mean)",
        "entropy (nats per token)",
        out / "figures" / "figure6_entropy.png",
        reference=R.figure6_reference(matched),
    )
    main_seed = evals[evals["seed"] == grid["seed"]]
    for metric, label in R.metrics(grid).items():
        for model in grid["models"]:
            sub = main_seed[(main_seed["metric"] == metric) & (main_seed["model"] == model)]
            R.plot_over_steps(
                sub.assign(value=sub["value"] * 100),
                "value",
                "method",
                f"{label} {model}",
                f"{label} (%)",
                out / "figures" / f"{metric}_{model}.png",
                panels="split",
            )
    ent = train[train["seed"] == grid["seed"]]
    R.plot_over_steps(
        ent,
        "entropy",
        "method",
        "policy entropy",
        "entropy (nats per token)",
        out / "figures" / "entropy_all.png",
        panels="model",
    )
    noise = R.noise_table(evals, grid)
    R.write_markdown(out / "summary.md", R.render_summary(checks, matched, noise, grid))
    for c in checks:
        verdict = {True: "holds", False: "does not hold", None: "not decidable"}[c["holds"]]
        log.info("%s %s: %s (ours %s; paper %s)", c["table"], c["claim"], verdict, c["ours"], c["paper"])
    if store_dir is not None:
        _sync_grid_mlflow(grid, eval_paths, metric_paths, root, out, store_dir, experiment)
    write_json(
        done_path,
        {"tables": [str(p) for p in outputs(out / "tables")], "matched_paper": matched, "orderings": checks},
    )


def _sync_grid_mlflow(
    grid: dict,
    eval_paths: list[str],
    metric_paths: list[str],
    root: str,
    out: str | Path,
    store_dir: str,
    experiment: str,
    runs_json: str | None = None,
) -> dict:
    """The grid's MLflow view, rebuilt from the result files (idempotent: runs are keyed by ``calibrl.key``).

    One run per (model, method, seed): a method run with extra seeds (grid.extra_seeds) gets one run per seed,
    tagged ``seed``, so the seed spread stays visible; the main seed is grid.seed. Params: the method's
    switches and the whole resolved grid config (flattened, ``grid.*``). Metrics: every evaluation metric
    per benchmark (``eval/{benchmark}/{metric}``) and every training metric (``train/{name}``) per step.
    Artifacts: the figures of the run's model and the tables (beside the paper's) it appears in; one more run,
    ``tables and figures``, holds every table, figure and the summary.
    """
    import pandas as pd

    from calibrl import report as R
    from calibrl.tracking import RunRecord, Store, flatten

    out = Path(out)
    store = Store(store_dir)  # fails here, before any write, if the store is locked or corrupted
    evals = R.load_evals(eval_paths, root)
    train = R.load_train_metrics(metric_paths, root)
    config_params = flatten(grid, "grid")
    skip = {"model", "method", "seed", "step", "seconds"}
    run_ids = {}
    for (model, method, seed), sub in evals.groupby(["model", "method", "seed"]):
        m = G.method({"grid": grid}, method)
        metrics = [(f"eval/{r.split}/{r.metric}", r.value, r.step) for r in sub.itertuples()]
        tr = train[(train["model"] == model) & (train["method"] == method) & (train["seed"] == seed)]
        for col in [c for c in tr.columns if c not in skip and pd.api.types.is_numeric_dtype(tr[c])]:
            metrics += [(f"train/{col}", v, s) for s, v in zip(tr["step"], tr[col]) if v == v]
        tables = [t for t, names in grid["tables"].items() if method in names]
        in_tables = {"table2_3": ["table2", "table3"]}
        artifacts = [(p, "figures") for p in sorted((out / "figures").glob(f"*_{model}.png"))]
        for t in tables:
            for name in in_tables.get(t, [t]):
                artifacts += [(p, "tables") for p in sorted((out / "tables").glob(f"{name}_vs_paper.*"))]
        record = RunRecord(
            key=f"grid/{model}/{method}/s{seed}",
            name=f"{model}/{method}/s{seed}",
            params={
                "model": model,
                "method": method,
                "seed": seed,
                **m.to_dict(),
                **{f"arch.{k}": v for k, v in architecture(grid, model).items()},
                **config_params,
            },
            tags={
                "part": "grid",
                "model": model,
                "method": method,
                "alpha": m.iac_alpha,
                "mu": m.dlc_mu,
                "seed": seed,
                "main_seed": str(seed == grid["seed"]).lower(),
                "table": ",".join(tables),
                "trainer": grid["trainer"],
            },
            metrics=metrics,
            artifacts=[(p, d) for p, d in artifacts if p.is_file()],
        )
        run_ids[record.name] = store.upsert(experiment, record)
    artifacts = [(p, "tables") for p in outputs(out / "tables")]
    artifacts += [(p, "figures") for p in sorted((out / "figures").glob("*.png"))]
    artifacts.append((out / "summary.md", "summary"))
    run_ids["tables"] = store.upsert(
        experiment,
        RunRecord(key="grid/tables", name="tables and figures", tags={"part": "grid"}, artifacts=artifacts),
    )
    log.info("logged %d grid runs to %s (experiment %s)", len(run_ids), store.uri, experiment)
    if runs_json:
        write_json(runs_json, {"experiment": experiment, "tracking_uri": store.uri, "runs": run_ids})
    return run_ids


def download_job(data: dict, split: str, out_path: str, manifest_path: str) -> None:
    """Fetch one Hub dataset (``train`` is ``grid.data.train``) and normalise it (``calibrl.data.hub``)."""
    from calibrl.data.hub import download

    key = data["train"] if split == "train" else split
    manifest = download(
        key,
        out_path,
        manifest_path,
        revision=data.get("revisions", {}).get(key),
        local_files=data.get("local_files", {}).get(key),
        on_error=_on_error(data),
    )
    log.info(
        "%s: %s rows from %s@%s",
        key,
        manifest.get("rows_written"),
        manifest.get("repo"),
        manifest.get("resolved_revision"),
    )


def openrlhf_run(grid: dict, model: str, method: str, seed: int, data_path: str, rows: int, run_dir: str) -> dict:
    """The plain dict ``calibrl.train.openrlhf.command.build_command`` takes, from the config.

    ``data_path`` is the run's prepared prompts (``prepare_openrlhf_data``), ``rows`` their number.
    """
    from calibrl.train.openrlhf.data import LABEL_KEY, PROMPT_KEY

    spec = grid["models"][model]
    m = G.method({"grid": grid}, method)
    res = dict(spec.get("resources", {}))
    nodes = int(res.pop("nodes", 1))
    run = Path(run_dir)
    memory = grid.get("memory_models", {}).get(spec.get("memory", ""), {}).get("hf_id")
    return {
        "name": f"{model}/{method}/s{seed}",
        "model": spec["hf_id"],
        "memory_model": memory if m.dlc_mu > 0 else None,
        "method": m.to_dict(),
        "seed": seed,
        "train": grid["train"],
        "data": {
            "train": str(data_path),
            "train_size": int(rows),
            "input_key": PROMPT_KEY,  # the template is already rendered into this field
            "label_key": LABEL_KEY,
            "prompt_template": "{problem}",
            "chat_template": bool(grid.get("chat_template")),
            "filtered_easiest": m.filter_easiest,
        },
        "paths": {
            "ckpt_dir": str(run / "ckpt" / "openrlhf"),
            "log_dir": str(run / "tensorboard"),
            "marker_dir": str(run / "ckpt"),
        },
        "resources": {"actor_nodes": nodes, "ref_nodes": 1, **res},
    }


def prepare_openrlhf_data(
    grid: dict, method: str, train_path: str, out_path: str | Path, success_path: str | None = None
) -> int:
    """The run's training prompts for OpenRLHF (rendered template; the filtering baseline's queries removed
    by their success rates from ``rank_job``); returns the number of rows."""
    from calibrl import filtering
    from calibrl.train.openrlhf.data import write_prompts

    m = G.method({"grid": grid}, method)
    records = _read(grid, train_path)
    keep = None
    if m.filter_easiest > 0:
        if not success_path:
            raise ValueError(f"method {method!r} filters (filter_easiest > 0) but no success rates were given")
        by_id = json.loads(Path(success_path).read_text())["rates"]
        missing = [r["id"] for r in records if r["id"] not in by_id]
        if missing:
            raise ValueError(f"{success_path}: no success rate for {len(missing)} training ids, e.g. {missing[:3]}")
        rates = [by_id[r["id"]] for r in records]
        keep = filtering.keep_indices(rates, m.filter_easiest)
        log.info("filtering baseline: %s", filtering.summary(rates, keep))
    return write_prompts(records, grid["prompt_template"], out_path, keep)


def openrlhf_train_job(
    grid: dict, model: str, method: str, seed: int, train_path: str, run_dir: str, success_path: str | None = None
) -> None:
    """Launch OpenRLHF for one run (inside a Ray cluster spanning the SLURM allocation when it has several
    nodes); the launcher writes the per-checkpoint markers and resumes from the last checkpoint."""
    import subprocess

    from calibrl.train.openrlhf.command import build_command

    data_path = Path(run_dir) / "train_prompts.jsonl"
    rows = prepare_openrlhf_data(grid, method, train_path, data_path, success_path)
    run = openrlhf_run(grid, model, method, seed, str(data_path), rows, run_dir)
    argv = build_command(run)
    if int(grid["models"][model].get("resources", {}).get("nodes", 1)) > 1:
        argv = ["bash", str(Path(__file__).parent / "train" / "openrlhf" / "ray_cluster.sh"), *argv]
    log.info("launching: %s", " ".join(argv))
    subprocess.run(argv, check=True)
    tensorboard_metrics(run["paths"]["log_dir"], Path(run_dir) / "metrics.jsonl")


def rank_job(grid: dict, model: str, train_path: str, out_path: str) -> None:
    """Success rate of every training query under the initial model (``filter_samples`` samples each, the
    training sampling settings), with vLLM: the ranking the filtering baseline drops the easiest share of."""
    from calibrl.evaluate_vllm import generate_and_grade, queue, sampling_kwargs, tokenizer_for
    from calibrl.tasks import Scorer

    tr = grid["train"]
    policy = grid["models"][model]["hf_id"]
    records = _read(grid, train_path)
    items = queue({"train": records}, grid["prompt_template"], tokenizer_for(policy, bool(grid.get("chat_template"))))
    n = int(tr["filter_samples"])
    with Scorer(workers=grid.get("workers", 1)) as scorer:
        _, grades = generate_and_grade(
            policy,
            items,
            scorer.grades,
            sampling_kwargs(n, tr["temperature"], tr["top_p"], tr["max_new_tokens"]),
            grid["seed"],
            int(grid["eval"].get("tensor_parallel_size", 1)),
            int(tr["max_prompt_len"]) + int(tr["max_new_tokens"]),
            what="training prompts ranked",
        )
    rates = {it.record["id"]: sum(g.correct for g in group) / n for it, group in zip(items, grades)}
    write_json(out_path, {"model": policy, "samples": n, "rates": rates})


def tensorboard_metrics(log_dir: str, out_path: str | Path) -> None:
    """OpenRLHF's TensorBoard scalars as the project's metrics.jsonl (one line per step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from calibrl.io import write_text

    rows: dict[int, dict] = {}
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            name = tag.split("/")[-1]
            for ev in acc.Scalars(tag):
                rows.setdefault(int(ev.step), {"step": int(ev.step)})[name] = float(ev.value)
    write_text(out_path, "".join(json.dumps(rows[k]) + "\n" for k in sorted(rows)))
