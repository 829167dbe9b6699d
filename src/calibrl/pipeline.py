"""The jobs the workflow's rules call, one function each: data, warm start, training, evaluation, ranking.

Each takes the rule's params (its slice of the config, built by ``calibrl.grid.*_params``) and paths, so a
rule's script is one call and the same job can be run by hand or from a test. The work itself lives in the
modules these call.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.data.records import Records, read_jsonl, write_jsonl
from calibrl.io import write_json

log = logging.getLogger("calibrl.pipeline")


def _threads(n: int) -> None:
    """Each job uses its own cores only: Snakemake runs several jobs side by side."""
    torch.set_num_threads(max(1, int(n)))


def _read(path: str, on_error: str = "fail") -> Records:
    return read_jsonl(path, on_error=on_error)


def data_job(params: dict, out_path: str, manifest: str) -> None:
    """One synthetic split (``calibrl.data.countdown``; ``params``: ``grid.data_params``), with its manifest."""
    from calibrl.data import countdown

    records = countdown.generate(params["split"], params["rows"], params["seed"])
    write_jsonl(out_path, records)
    sols = [len(r["verifier"]["solutions"]) for r in records]
    entry = {
        "source": "countdown (synthetic, calibrl.data.countdown)",
        **params,
        "mean_solutions": sum(sols) / len(sols),
        "multi_solution_share": sum(s >= 2 for s in sols) / len(sols),
    }
    log.info("%s: %s", params["split"], entry)
    write_json(manifest, entry)


def download_job(params: dict, out_path: str, manifest_path: str) -> None:
    """Fetch one Hub dataset and normalise it (``calibrl.data.hub``; ``params``: ``grid.data_params``)."""
    from calibrl.data.hub import download

    manifest = download(
        params["dataset"],
        out_path,
        manifest_path,
        revision=params["revision"],
        local_files=params["local_files"],
        on_error=params["on_error"],
    )
    log.info(
        "%s: %s rows from %s@%s",
        params["dataset"],
        manifest.get("rows_written"),
        manifest.get("repo"),
        manifest.get("resolved_revision"),
    )


def warmstart_job(params: dict, train_path: str, model_dir: str, info_path: str, threads: int = 1) -> None:
    """Supervised warm start of a tiny model (``params``: ``grid.warmstart_params``)."""
    from calibrl.train.warmstart import warmstart

    _threads(threads)
    ws = params["warmstart"]
    records = _read(train_path, params["on_error"])
    info = warmstart(
        records, params["arch"], ws["steps"], ws["batch_size"], ws["lr"], params["seed"], params["template"], model_dir
    )
    write_json(info_path, {**info, "model": params["model"], "path": str(Path(model_dir).resolve())})


def _model_dir(info: str | None) -> str | None:
    return json.loads(Path(info).read_text())["path"] if info else None


def settings_job(
    settings: dict,
    out_path: str,
    train_path: str,
    init_info: str | None = None,
    memory_info: str | None = None,
    success_path: str | None = None,
) -> None:
    """The run's ``settings.json`` (``calibrl.checkpoints.stamp``): its config slice (``grid.train_params``) and
    the digests of the files it trains from, which training and evaluation both check against."""
    inputs = {
        "train": checkpoints.digest(train_path),
        "init": checkpoints.digest(_model_dir(init_info)),
        "memory": checkpoints.digest(_model_dir(memory_info)),
        "success": checkpoints.digest(success_path),
    }
    stamp = checkpoints.stamp(settings, inputs)
    log.info("%s: fingerprint %s", settings["run"], stamp["fingerprint"])
    write_json(out_path, stamp)
    checkpoints.date_settings(out_path)


def train_job(
    settings_path: str,
    run_dir: str,
    train_path: str,
    steps: int | None = None,
    init_info: str | None = None,
    memory_info: str | None = None,
    success_path: str | None = None,
    layout: dict | None = None,
    threads: int = 1,
    workers: int = 1,
) -> None:
    """Train one run to ``train.steps`` under the run's lock, resuming from its last checkpoint when that was
    made with the same settings and inputs (``settings_path``: its ``settings.json``; ``calibrl.checkpoints``).

    ``init_info``/``memory_info``: the warm starts (tiny models); ``success_path``: at paper scale, the
    filtering baseline's success rates (``rank_job``); ``layout``: the paper-scale GPU layout."""
    stamp = json.loads(Path(settings_path).read_text())
    settings = stamp["settings"]
    # steps: the run's length (calibrl.grid.run_length), outside the CPU trainer's stamp
    length = {"steps": steps} if steps is not None else {}
    settings = {**settings, "train": {**settings["train"], **length}}
    if "steps" not in settings["train"]:
        raise ValueError(f"{settings_path}: the run's length is not in its settings; pass steps (rule train's params)")
    with checkpoints.run_lock(run_dir):
        checkpoints.claim(run_dir, stamp)
        if settings["trainer"] == "openrlhf":
            from calibrl.train.openrlhf.job import train

            return train(settings, layout or {}, train_path, run_dir, success_path)
        from calibrl.tasks import Scorer
        from calibrl.train.local import Trainer

        _threads(threads)
        records = _read(train_path, settings["on_error"])
        with Scorer(workers=workers) as scorer:
            Trainer(
                G.Method(**{k: v for k, v in settings["method"].items() if k != "name"}),
                G.TrainSettings.from_config(settings["train"]),
                records,
                _model_dir(init_info),
                run_dir,
                scorer,
                seed=settings["seed"],
                memory_dir=_model_dir(memory_info),
                template=settings["template"],
            ).run()


def evaluate_job(
    params: dict,
    settings_path: str,
    markers: list[str],
    split_paths: dict[str, str],
    out_paths: list[str],
    steps: list[int],
    threads: int = 1,
    workers: int = 1,
) -> None:
    """Evaluate each checkpoint (``markers[i]`` -> ``out_paths[i]``, step ``steps[i]``; ``params``:
    ``grid.eval_params``), after checking it was trained with the run's current settings (``settings_path``).

    The splits are read once and one set of grading workers serves every checkpoint; each result is the
    one the checkpoint gets when evaluated alone (sampling is seeded per checkpoint)."""
    from calibrl.evaluate import evaluate_checkpoint
    from calibrl.tasks import Scorer

    if not len(markers) == len(out_paths) == len(steps):
        raise ValueError(f"{len(markers)} markers, {len(out_paths)} outputs and {len(steps)} steps")
    settings = G.EvalSettings.from_params(params["settings"])
    expected = json.loads(Path(settings_path).read_text())["fingerprint"]
    ckpts = [checkpoints.check_marker(m, expected) for m in markers]  # all, before any work
    _threads(threads)
    splits = {name: _read(path, params["on_error"]) for name, path in split_paths.items()}
    with Scorer(workers=workers) as scorer:
        for ckpt, out_path, step in zip(ckpts, out_paths, steps):
            log.info("checkpoint step %d: %s", step, ckpt["policy"])
            results = evaluate_checkpoint(settings, ckpt["policy"], splits, scorer.grades)
            record = {"step": step, "policy": ckpt["policy"], "fingerprint": ckpt["fingerprint"]}
            write_json(out_path, {**record, "sampling": params["settings"], "splits": results})


def rank_job(params: dict, train_path: str, out_path: str, workers: int = 1) -> None:
    """Success rate of every training query under the initial model (``params``: ``grid.rank_params``), the
    ranking the filtering baseline drops the easiest share of (``calibrl.evaluate_vllm.rank_queries``)."""
    from calibrl.evaluate_vllm import rank_queries
    from calibrl.tasks import Scorer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is the login node's download (rule download_model)
    records = _read(train_path, params["on_error"])
    with Scorer(workers=workers) as scorer:
        rates = rank_queries(params, records, scorer.grades)
    model = {"model": params.get("hf_id", params["model"]), "revision": params.get("revision"), "path": params["model"]}
    write_json(out_path, {**model, "samples": params["samples"], "rates": rates})


def download_model_job(params: dict, info_path: str) -> None:
    """One Hub model into the shared folder, once, at its pinned revision (``params``: ``grid.download_params``;
    ``calibrl.model_store``)."""
    from calibrl.model_store import download

    info = download(params["hf_id"], params["revision"], params["path"], info_path)
    log.info(
        "%s@%s (%s): %d files in %s",
        info["hf_id"],
        info["revision"],
        info["resolved_revision"],
        len(info["files"]),
        info["path"],
    )
