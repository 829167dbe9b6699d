"""A run's training prompts as OpenRLHF reads them: one JSONL row per query with the rendered prompt.

The prompt is rendered here, chat template included, by ``calibrl.tasks.render_prompts`` (the function the
evaluators use), into the ``prompt`` field that the command names as ``--data.input_key``; OpenRLHF takes it as it
is (no ``--data.apply_chat_template``: OpenRLHF 0.11.2 cannot pass ``enable_thinking`` to a chat template). The
rows are shuffled with the data seed (``--data.max_samples`` takes a prefix), and the filtering baseline's queries
are removed here, so OpenRLHF sees exactly the set it trains on.

Over-long prompts are dropped here, as verl's ``filter_overlong_prompts`` drops them: OpenRLHF 0.11.2 tokenizes a
prompt (``add_special_tokens=False``) and keeps its last ``--data.max_len - --rollout.max_new_tokens`` tokens
(``utils/agent.py``, ``SingleTurnAgentExecutor.execute``: ``prompt_token_ids[-max_prompt_length:]``), which cuts the
chat template's header and the problem's start. A rendered prompt of more than ``grid.train.max_prompt_len`` tokens
of the run's tokenizer is left out of the file; the count is logged and recorded beside the file
(:func:`overlong_path`), and the file's row count (what ``launch`` counts for the episode arithmetic,
``command.episodes_and_samples``) is what remains.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from calibrl.checkpoints import RunStamp

log = logging.getLogger("calibrl.openrlhf.data")

PROMPT_KEY = "prompt"
LABEL_KEY = "answer"


def overlong_path(out_path: str | Path) -> Path:
    """Where :func:`write_prompts` records the prompts it dropped as over-long: ``<file stem>.overlong.json``."""
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}.overlong.json")


def prompt_lengths(prompts: Sequence[str], tokenizer) -> list[int]:
    """Tokens per rendered prompt as OpenRLHF 0.11.2 counts them (``hf_tokenizer(text=prompt,
    add_special_tokens=False)``, ``utils/agent.py``)."""
    if not prompts:
        return []
    return [len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def write_prompts(
    records: Sequence[dict],
    template: str,
    out_path: str | Path,
    keep: Sequence[int] | None = None,
    tokenizer=None,
    enable_thinking: bool = False,
    max_prompt_len: int | None = None,
    length_tokenizer=None,
) -> int:
    """The records with their rendered ``prompt`` (only the ``keep`` indices when given; through the chat template
    of ``tokenizer`` when given); returns the row count. With ``max_prompt_len``, a prompt of more tokens
    (:func:`prompt_lengths` with ``length_tokenizer``, else ``tokenizer``) is left out, and the count, the ids and
    the limit are logged and written to :func:`overlong_path`."""
    from calibrl.data.records import write_jsonl
    from calibrl.io import write_json
    from calibrl.tasks import render_prompts

    chosen = records if keep is None else [records[i] for i in keep]
    prompts = render_prompts(chosen, template, tokenizer, enable_thinking)
    rows = [{**r, PROMPT_KEY: p} for r, p in zip(chosen, prompts)]
    if max_prompt_len is not None:
        counter = length_tokenizer if length_tokenizer is not None else tokenizer
        if counter is None:
            raise ValueError("write_prompts: max_prompt_len needs a tokenizer to count the prompts' tokens")
        lengths = prompt_lengths(prompts, counter)
        over = [(r["id"], n) for r, n in zip(rows, lengths) if n > int(max_prompt_len)]
        rows = [r for r, n in zip(rows, lengths) if n <= int(max_prompt_len)]
        record = {
            "max_prompt_len": int(max_prompt_len),
            "rows": len(rows),
            "dropped": len(over),
            "longest": max(lengths, default=0),
            "dropped_ids": [i for i, _ in over],
        }
        write_json(overlong_path(out_path), record)
        if over:
            log.warning(
                "%d of %d prompts have more than grid.train.max_prompt_len = %d tokens (longest %d) and are dropped "
                "(OpenRLHF would cut their start, chat header included): e.g. %s; recorded in %s",
                len(over), len(lengths), int(max_prompt_len), max(n for _, n in over),
                ", ".join(str(i) for i, _ in over[:5]), overlong_path(out_path),
            )  # fmt: skip
        else:
            log.info("every one of %d prompts fits grid.train.max_prompt_len = %d tokens (longest %d)",
                     len(lengths), int(max_prompt_len), record["longest"])  # fmt: skip
    return write_jsonl(out_path, rows)


def prepare(stamp: RunStamp | dict, out_path: str | Path, tokenizer=None) -> int:
    """The prompt file of the run of ``stamp`` (its settings.json, or that file's content): the training set shuffled
    with the data seed, the filtering baseline's easiest queries removed by the initial model's success rates
    (``paths.success``, rule rank_train), rendered through the model's chat template (``tokenizer``; loaded from the
    downloaded policy folder when none is given) exactly as evaluation renders them, less the prompts of more than
    ``max_prompt_len`` tokens of that tokenizer (:func:`write_prompts`). Returns the row count."""
    from calibrl.gpu.prompt_order import training_queries

    stamp = RunStamp.of(stamp)
    settings, paths = stamp.settings, stamp.paths
    records, keep = training_queries(stamp)
    has_tokenizer = (Path(paths["init"]) / "tokenizer_config.json").is_file()  # the job's downloaded policy folder
    if tokenizer is None and (settings["chat_template"] or has_tokenizer):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(paths["init"])
    chat = tokenizer if settings["chat_template"] else None
    if tokenizer is None:  # no tokenizer in the policy folder (a test's made-up one): no lengths to count
        log.warning("no tokenizer at %s: prompt lengths not checked against max_prompt_len", paths["init"])
        limit = None
    else:
        limit = int(settings["train"]["max_prompt_len"])
    return write_prompts(
        records, settings["template"], out_path, keep, chat, settings["enable_thinking"], limit, tokenizer
    )
