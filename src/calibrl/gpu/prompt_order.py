"""A run's training queries in the order every GPU trainer sees them: the training set shuffled with the run's data
seed, less the filtering baseline's easiest queries. Each backend writes them in its trainer's format (OpenRLHF's
JSONL, verl's parquet) and neither reshuffles, so both trainers see the same queries at the same steps."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from calibrl.checkpoints import RunStamp

log = logging.getLogger("calibrl.gpu.prompt_order")


def training_queries(stamp: RunStamp) -> tuple[list[dict], list[int] | None]:
    """The run's training records in its data seed's order (``random.Random("train-order:<data_seed>")``), and the
    positions among them that the filtering baseline keeps (``calibrl.algo.filtering.keep_indices`` of the initial
    model's success rates, ``paths.success`` from rule rank_train); None where the method filters nothing."""
    from calibrl.algo import filtering
    from calibrl.data.records import read_jsonl

    settings, paths = stamp.settings, stamp.paths
    records = list(read_jsonl(paths["train"], on_error=settings["on_error"]))
    random.Random(f"train-order:{settings['data_seed']}").shuffle(records)
    share = settings["method"]["filter_easiest"]
    if share <= 0:
        return records, None
    by_id = json.loads(Path(paths["success"]).read_text())["rates"]
    missing = [r["id"] for r in records if r["id"] not in by_id]
    if missing:
        raise ValueError(f"{paths['success']}: no success rate for {len(missing)} training ids, e.g. {missing[:3]}")
    rates = [by_id[r["id"]] for r in records]
    keep = filtering.keep_indices(rates, share)
    log.info("filtering baseline: %s", filtering.summary(rates, keep))
    return records, keep
