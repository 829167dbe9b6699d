"""A run's training prompts as verl reads them: a parquet file of one row per query (``prompt``: one user turn).

verl applies the model's chat template to the user turn itself (``data.apply_chat_template_kwargs``: the run's
thinking switch), as ``calibrl.tasks.render_prompts`` does for evaluation, so a run is evaluated on the text it
trained on (the turn's content is ``calibrl.tasks.format_prompt``'s). The rows are in the data seed's order, the
order the OpenRLHF backend gives its prompts (``random.Random("train-order:<data_seed>")``), and verl does not
reshuffle them (``data.shuffle=False``): both trainers see the same queries at the same steps. The filtering
baseline's easiest queries are removed here (``paths.success``, rule rank_train's ranking), and prompts of more
than ``grid.train.max_prompt_len`` tokens are dropped and counted beside the file (verl would refuse them:
``data.truncation=error``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from calibrl.checkpoints import RunStamp

log = logging.getLogger("calibrl.verl.data")

PROMPTS = "train_prompts.parquet"
"""The run's prepared prompt file, beside its settings.json."""
SOURCE = "calibrl"
"""Every row's ``data_source``: reward.py grades every row alike (math-verify)."""


def overlong_path(out_path: str | Path) -> Path:
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}.overlong.json")


def rows(stamp: RunStamp, tokenizer) -> tuple[list[dict], dict]:
    """The rows verl trains on, and the record of the prompts dropped as over-long."""
    from calibrl.gpu.prompt_order import training_queries
    from calibrl.tasks import format_prompt, render_prompts

    settings = stamp.settings
    records, keep = training_queries(stamp)
    if keep is not None:
        records = [records[i] for i in keep]
    limit = int(settings["train"]["max_prompt_len"])
    rendered = render_prompts(records, settings["template"], tokenizer, settings["enable_thinking"])
    lengths = [len(ids) for ids in tokenizer(rendered, add_special_tokens=False)["input_ids"]] if rendered else []
    out, dropped = [], []
    for i, (record, n) in enumerate(zip(records, lengths)):
        if n > limit:
            dropped.append(record["id"])
            continue
        out.append({
            "data_source": SOURCE,
            "prompt": [{"role": "user", "content": format_prompt(record, settings["template"])}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(record["answer"])},
            "extra_info": {"index": i, "id": str(record["id"])},
        })  # fmt: skip
    record = {"max_prompt_len": limit, "rows": len(out), "dropped": len(dropped), "longest": max(lengths, default=0),
              "dropped_ids": dropped}  # fmt: skip
    if dropped:
        log.warning("%d of %d prompts have more than grid.train.max_prompt_len = %d tokens and are dropped: e.g. %s",
                    len(dropped), len(records), limit, ", ".join(map(str, dropped[:5])))  # fmt: skip
    return out, record


def prepare(stamp: RunStamp | dict, out_path: str | Path) -> int:
    """Write the prompt file of the run of ``stamp`` to ``out_path`` (parquet, atomically) and the over-long record
    beside it; returns the row count. The tokenizer is the downloaded policy's (its chat template)."""
    import pandas as pd
    from transformers import AutoTokenizer

    from calibrl.io import atomic_path, write_json

    stamp = RunStamp.of(stamp)
    tokenizer = AutoTokenizer.from_pretrained(stamp.paths["init"])
    table, record = rows(stamp, tokenizer)
    with atomic_path(out_path) as tmp:
        pd.DataFrame(table).to_parquet(tmp)
    write_json(overlong_path(out_path), record)
    return len(table)
