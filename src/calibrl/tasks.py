"""How a record is posed to a model and how a response to it is checked.

Synthetic countdown records are checked by the task's own rules plus math-verify
(``calibrl.data.countdown.check``); benchmark records by math-verify against the gold answer
(``calibrl.grading.grade_one``). Both run inside the grader's worker processes, so math-verify's
signal timeouts work and a pathological response costs at most its timeout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from calibrl.data import countdown
from calibrl.grading import Grade, Grader


def format_prompt(record: dict, template: str) -> str:
    """The text the model is conditioned on (after ``<bos>``): the config's template around the problem."""
    return template.format(problem=record["problem"])


def render_prompts(records: Sequence[dict], template: str, tokenizer=None, enable_thinking: bool = False) -> list[str]:
    """The model's input text per record: the template around the problem, then, given a tokenizer, its chat
    template as one user turn with the generation prompt. ``enable_thinking`` goes to the chat template
    (Qwen3's thinking switch; a template without it ignores it). Training prompts (OpenRLHF) and evaluation
    prompts are both rendered here, so a run is evaluated on exactly the text it was trained on."""
    texts = [format_prompt(r, template) for r in records]
    if tokenizer is None:
        return texts
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
        )
        for t in texts
    ]


def is_countdown(record: dict) -> bool:
    return str(record.get("source", "")).startswith("countdown")


def countdown_grade(response: str, gold: str, timeout: float = 5.0) -> Grade:
    """Grade a countdown response; ``gold`` is the JSON of ``{"problem", "answer", "verifier"}``.

    ``extracted`` is the canonical answer when correct (so distinct correct answers can be counted).
    """
    try:
        record = json.loads(gold)
        correct, canon = countdown.check(response, record)
        return Grade(bool(correct), canon)
    except Exception as exc:  # a grader never takes the job down
        return Grade(False, None, error=f"{type(exc).__name__}: {str(exc)[:200]}")


def gold_string(record: dict) -> str:
    if is_countdown(record):
        keep = {k: record[k] for k in ("problem", "answer", "verifier") if k in record}
        return json.dumps(keep, sort_keys=True)
    return str(record["answer"])


class Scorer:
    """Binary verifiable rewards for (response, record) pairs, cached: math answers graded in worker processes,
    countdown answers in this one."""

    def __init__(self, workers: int = 2, timeout: float = 5.0):
        self.math = Grader(workers=workers, timeout=timeout)
        # Countdown is graded in this process: math-verify sees only ``a op b`` over two of the problem's own
        # numbers (``countdown.check`` parses the response in one bounded scan first), which cannot hang, and the
        # workers' per-item messages (hang detection) cost more than the grading itself (benchmarks/README.md).
        self.countdown = Grader(workers=0, timeout=timeout, check=countdown_grade)

    def grades(self, responses: Sequence[str], records: Sequence[dict]) -> list[Grade]:
        out: list[Grade | None] = [None] * len(responses)
        for grader, want in ((self.countdown, True), (self.math, False)):
            idx = [i for i, r in enumerate(records) if is_countdown(r) == want]
            if idx:
                graded = grader.grade([(responses[i], gold_string(records[i])) for i in idx])
                for i, g in zip(idx, graded):
                    out[i] = g
        return out  # type: ignore[return-value]

    def __call__(self, responses: Sequence[str], records: Sequence[dict]) -> list[tuple[bool, str | None]]:
        return [(g.correct, g.extracted if g.correct else None) for g in self.grades(responses, records)]

    def close(self) -> None:
        self.math.close()
        self.countdown.close()

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
