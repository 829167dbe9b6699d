"""The data rules' jobs: a synthetic split of the countdown task, or one Hub dataset normalised."""

from __future__ import annotations

import logging

from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.io import write_json

log = logging.getLogger("calibrl.data.jobs")


def data_job(params: dict, out_path: str, manifest: str) -> None:
    """One synthetic split (``calibrl.data.countdown``; ``params``: ``grid.data_params``), with its manifest."""
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
    from calibrl.data.hub import download  # the Hub client only where a download runs

    manifest = download(
        params["dataset"],
        out_path,
        manifest_path,
        revision=params["revision"],
        local_files=params["local_files"],
        on_error=params["on_error"],
        subset=params.get("subset"),
        seed=params.get("seed"),  # set with subset only (calibrl.grid.data_params)
    )
    log.info(
        "%s: %s rows from %s@%s",
        params["dataset"],
        manifest.get("rows_written"),
        manifest.get("repo"),
        manifest.get("resolved_revision"),
    )
