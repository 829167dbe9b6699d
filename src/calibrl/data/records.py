"""The JSONL record schema shared by the real benchmarks and the synthetic countdown task.

One JSON object per line. Required keys, each a non-empty string:

``id``       unique within a file
``problem``  the prompt text the model sees
``answer``   the gold answer (for countdown: the target number, e.g. ``"15"``)
``source``   where the record comes from (e.g. ``"countdown-train"``, ``"math500"``)

Optional: ``verifier`` (an object with task-specific data for the grader). Other keys are kept as is.

Blank (whitespace-only) lines are ignored. A bad row -- bytes that are not UTF-8, invalid JSON, a
value that is not an object, a missing, empty or non-string required key, a ``verifier`` that is not
an object, an ``id`` seen earlier in the file, or (``check_golds=True``) a gold answer math-verify cannot
parse -- either fails the read (``on_error="fail"``, the workflow's default ``grid.data.on_error``) with a
:class:`DataError` that names the file, the 1-based line and the problem of the first bad row, the number
of bad rows per reason and the file:line of each (up to 20), or is dropped and counted per reason
(``on_error="skip"``); the counts are logged and kept on ``Records.skipped``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from calibrl.io import write_text

log = logging.getLogger(__name__)

REQUIRED_KEYS = ("id", "problem", "answer", "source")
OPTIONAL_KEYS = ("verifier",)

# skip reasons (the keys of Records.skipped)
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_KEY = "missing_key"
EMPTY_KEY = "empty_key"
WRONG_TYPE = "wrong_type"
DUPLICATE_ID = "duplicate_id"
UNPARSEABLE_GOLD = "unparseable_gold"

MAX_LISTED = 20  # bad rows listed one by one in a DataError


class DataError(ValueError):
    """A data file or record does not follow the record schema."""


class Records(list):
    """The rows of a JSONL file (a plain ``list`` of dicts) plus what was dropped while reading.

    ``skipped`` maps a reason (``invalid_json``, ``duplicate_id``, ...) to the number of rows dropped
    for it; it is empty after a clean read and always empty with ``on_error="fail"``.
    """

    def __init__(
        self, rows: Iterable[dict] = (), skipped: Mapping[str, int] | None = None, path: str | Path | None = None
    ):
        super().__init__(rows)
        self.skipped: dict[str, int] = dict(skipped or {})
        self.path = Path(path) if path is not None else None

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


def record_problem(record: object) -> tuple[str, str] | None:
    """``(reason, message)`` if ``record`` breaks the schema (the duplicate-id rule aside), else None."""
    if not isinstance(record, dict):
        return NOT_AN_OBJECT, f"expected a JSON object, got {type(record).__name__}"
    for key in REQUIRED_KEYS:
        if key not in record:
            return MISSING_KEY, f"missing required key {key!r}"
        value = record[key]
        if not isinstance(value, str):
            return WRONG_TYPE, f"key {key!r} must be a string, got {type(value).__name__}"
        if not value.strip():
            return EMPTY_KEY, f"required key {key!r} is empty"
    if "verifier" in record and not isinstance(record["verifier"], dict):
        return WRONG_TYPE, f"key 'verifier' must be an object, got {type(record['verifier']).__name__}"
    return None


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_line(raw: bytes, lineno: int) -> tuple[str, str] | dict | None:
    """The record on one line, None for a blank line, or ``(reason, message)`` for a bad row."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return INVALID_UTF8, f"bytes are not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if lineno == 1 and text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        return None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        return INVALID_JSON, f"invalid JSON: {exc}"
    problem = record_problem(obj)
    return problem if problem is not None else obj


def read_jsonl(path: str | Path, on_error: Literal["fail", "skip"] = "fail", check_golds: bool = False) -> Records:
    """Read and validate a JSONL file of records.

    ``on_error="fail"`` raises :class:`DataError` if any row is bad; the message starts with the first
    (``"<file>:<line>: <problem>"``), then counts the bad rows per reason and lists each one's file:line and
    problem (the first 20). ``"skip"`` drops bad rows, logs a warning with the count per reason and records
    the counts on the returned :class:`Records` (``.skipped``). With duplicate ids the first row is kept.
    ``check_golds`` also parses every gold answer with math-verify (``calibrl.grading.gold_problems``, in worker
    processes; downloads already check this), a row whose gold does not parse being a bad row
    (``unparseable_gold``).
    """
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    path = Path(path)
    rows: list[dict] = []
    skipped: Counter[str] = Counter()
    bad: list[tuple[int, str]] = []  # (line, problem) of each bad row
    first_line: dict[str, int] = {}
    with open(path, "rb") as fh:  # binary: lines end at b"\n" only, and bad bytes stay on their line
        for lineno, raw in enumerate(fh, start=1):
            parsed = _parse_line(raw, lineno)
            if parsed is None:
                continue
            if isinstance(parsed, dict):
                rid = parsed["id"]
                if rid not in first_line:
                    first_line[rid] = lineno
                    rows.append(parsed)
                    continue
                parsed = DUPLICATE_ID, f"duplicate id {rid!r} (first on line {first_line[rid]})"
            reason, message = parsed
            skipped[reason] += 1
            bad.append((lineno, message))
    if check_golds:
        from calibrl.grading import gold_problems

        unparseable = gold_problems([r["answer"] for r in rows])
        skipped[UNPARSEABLE_GOLD] += len(unparseable)
        bad += [(first_line[rows[i]["id"]], why) for i, why in unparseable.items()]
        rows = [r for i, r in enumerate(rows) if i not in unparseable]
    skipped += Counter()  # drop zero counts
    bad = sorted(bad)[:MAX_LISTED]
    if not skipped:
        return Records(rows, path=path)
    n_bad = sum(skipped.values())
    counts = ", ".join(f"{reason}={count}" for reason, count in sorted(skipped.items()))
    where = [f"{path}:{lineno}: {message}" for lineno, message in bad]
    listed = "\n  ".join(where) + (f"\n  ... and {n_bad - len(bad)} more" if n_bad > len(bad) else "")
    if on_error == "fail":
        what = f"{n_bad} bad row(s) ({counts}); on_error is fail (grid.data.on_error: skip drops them)"
        raise DataError(f"{where[0]}\n{path}: {what}:\n  {listed}")
    log.warning("%s: skipped %d bad row(s): %s\n  %s", path, n_bad, counts, listed)
    return Records(rows, skipped=dict(sorted(skipped.items())), path=path)


def write_jsonl(path: str | Path, records: Iterable[Mapping]) -> int:
    """Write ``records`` as JSONL, atomically; returns the number of rows written.

    Every record is validated first (and ids must be unique), so a bad record raises
    :class:`DataError` and leaves any existing file untouched. The rows go to a temporary file in the
    target's directory, flushed and renamed onto ``path`` (``calibrl.io.atomic_path``); parent directories are
    created as needed.
    """
    path = Path(path)
    lines: list[str] = []
    seen: set[str] = set()
    for index, record in enumerate(records):
        record = dict(record) if isinstance(record, Mapping) else record
        problem = record_problem(record)
        if problem is not None:
            raise DataError(f"record {index} for {path}: {problem[1]}")
        if record["id"] in seen:
            raise DataError(f"record {index} for {path}: duplicate id {record['id']!r}")
        seen.add(record["id"])
        try:
            lines.append(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
        except (TypeError, ValueError) as exc:
            raise DataError(f"record {index} for {path}: not JSON-serialisable: {exc}") from exc
    write_text(path, "".join(lines))
    return len(lines)
