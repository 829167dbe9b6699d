"""The training prompts as OpenRLHF reads them: one JSONL row per query with the rendered prompt.

The prompt is rendered here with ``calibrl.tasks.format_prompt`` (the same function the evaluators use),
into the ``prompt`` field that the command names as ``--data.input_key``; OpenRLHF then only applies the
model's chat template (``--data.apply_chat_template``), which is all it can do with one (it ignores
``--data.input_template`` when a chat template is applied). The filtering baseline's queries are removed
here too, so OpenRLHF sees exactly the set it trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calibrl.data.records import write_jsonl
from calibrl.tasks import format_prompt

PROMPT_KEY = "prompt"
LABEL_KEY = "answer"


def write_prompts(
    records: Sequence[dict], template: str, out_path: str | Path, keep: Sequence[int] | None = None
) -> int:
    """The records with their rendered ``prompt`` (only the ``keep`` indices when given); returns the row count."""
    chosen = records if keep is None else [records[i] for i in keep]
    rows = [{**r, PROMPT_KEY: format_prompt(r, template)} for r in chosen]
    return write_jsonl(out_path, rows)
