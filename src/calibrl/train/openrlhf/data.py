"""The training prompts as OpenRLHF reads them: one JSONL row per query with the rendered prompt.

The prompt is rendered here, chat template included, by ``calibrl.tasks.render_prompts`` (the function the
evaluators use), into the ``prompt`` field that the command names as ``--data.input_key``; OpenRLHF takes it
as it is (no ``--data.apply_chat_template``: OpenRLHF 0.11.2 cannot pass ``enable_thinking`` to a chat
template). The filtering baseline's queries are removed here too, so OpenRLHF sees exactly the set it
trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calibrl.data.records import write_jsonl
from calibrl.tasks import render_prompts

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
    """The records with their rendered ``prompt`` (only the ``keep`` indices when given; through the chat
    template of ``tokenizer`` when given); returns the row count."""
    chosen = records if keep is None else [records[i] for i in keep]
    prompts = render_prompts(chosen, template, tokenizer, enable_thinking)
    return write_jsonl(out_path, [{**r, PROMPT_KEY: p} for r, p in zip(chosen, prompts)])
