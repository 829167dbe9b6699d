"""A run's training prompts as OpenRLHF reads them: one JSONL row per query with the rendered prompt.

The prompt is rendered here, chat template included, by ``calibrl.tasks.render_prompts`` (the function the
evaluators use), into the ``prompt`` field that the command names as ``--data.input_key``; OpenRLHF takes it as it
is (no ``--data.apply_chat_template``: OpenRLHF 0.11.2 cannot pass ``enable_thinking`` to a chat template). The
rows are shuffled with the data seed (``--data.max_samples`` takes a prefix), and the filtering baseline's queries
are removed here, so OpenRLHF sees exactly the set it trains on.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("calibrl.openrlhf.data")

PROMPT_KEY = "prompt"
LABEL_KEY = "answer"


def write_prompts(
    records: Sequence[dict],
    template: str,
    out_path: str | Path,
    keep: Sequence[int] | None = None,
    tokenizer=None,
    enable_thinking: bool = False,
) -> int:
    """The records with their rendered ``prompt`` (only the ``keep`` indices when given; through the chat template
    of ``tokenizer`` when given); returns the row count."""
    from calibrl.data.records import write_jsonl
    from calibrl.tasks import render_prompts

    chosen = records if keep is None else [records[i] for i in keep]
    prompts = render_prompts(chosen, template, tokenizer, enable_thinking)
    return write_jsonl(out_path, [{**r, PROMPT_KEY: p} for r, p in zip(chosen, prompts)])


def prepare(stamp: dict, out_path: str | Path, tokenizer=None) -> int:
    """The prompt file of the run of ``stamp`` (its settings.json): the training set shuffled with the data seed, the
    filtering baseline's easiest queries removed by the initial model's success rates (``paths.success``, rule
    rank_train), rendered through the model's chat template (``tokenizer``; loaded from the downloaded policy folder
    when ``chat_template`` is set and none is given) exactly as evaluation renders them. Returns the row count."""
    from calibrl.algo import filtering
    from calibrl.data.records import read_jsonl

    settings, paths = stamp["settings"], stamp["paths"]
    records = list(read_jsonl(paths["train"], on_error=settings["on_error"]))
    random.Random(f"train-order:{settings['data_seed']}").shuffle(records)
    if settings["chat_template"] and tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(paths["init"])
    share = settings["method"]["filter_easiest"]
    keep = None
    if share > 0:
        by_id = json.loads(Path(paths["success"]).read_text())["rates"]
        missing = [r["id"] for r in records if r["id"] not in by_id]
        if missing:
            raise ValueError(f"{paths['success']}: no success rate for {len(missing)} training ids, e.g. {missing[:3]}")
        rates = [by_id[r["id"]] for r in records]
        keep = filtering.keep_indices(rates, share)
        log.info("filtering baseline: %s", filtering.summary(rates, keep))
    tokenizer = tokenizer if settings["chat_template"] else None
    return write_prompts(records, settings["template"], out_path, keep, tokenizer, settings["enable_thinking"])
