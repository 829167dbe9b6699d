"""The paper's training set and evaluation benchmarks: where they live on the Hub and how their rows become records.

Pure normalisation, no network: :mod:`calibrl.data.hub` fetches the files and feeds their rows here.

:data:`BENCHMARKS` maps a key to a :class:`BenchmarkSpec` (Hub repo id, config, split, the data files to
look for, the upstream columns read). ``spec.normalise(raw_rows)`` maps rows in the upstream column layout
to records of :mod:`calibrl.data.records`: ``id`` (``"<key>-<upstream row index, 5 digits>"``, e.g.
``gsm8k-00012``; the index counts every upstream row, so ids do not shift when a row is dropped),
``problem`` (the upstream text, unchanged), ``answer`` (the gold answer, as each benchmark defines it),
``source`` (the key) and a few useful extra columns.

Gold answers (the columns read are listed on each ``normalise_*`` function):

=================  ====================================  ======================================================
key                Hub dataset (config, split)            gold ``answer``
=================  ====================================  ======================================================
``deepscaler``     agentica-org/DeepScaleR-Preview-       ``answer`` column; rows with an empty answer dropped
                   Dataset (-, train)
``gsm8k``          openai/gsm8k (main, test)              text after the last ``####`` of ``answer``, commas
                                                          between digits (thousands separators) removed
``math500``        HuggingFaceH4/MATH-500 (-, test)       ``answer`` column
``lighteval``      DigitalLearningGmbH/MATH-lighteval     last ``\\boxed{}`` of ``solution``
                   (default, test)                        (:func:`last_boxed_answer`, verl's semantics)
``aime24``         HuggingFaceH4/aime_2024 (-, train)     ``answer`` as a string integer, as written (``"025"``)
``minerva``        math-ai/minervamath (-, test)          last ``\\boxed{}`` of ``solution``; the ``answer``
                                                          column (which holds exactly that) if no solution
``olympiadbench``  math-ai/olympiadbench (-, test)        ``final_answer`` (a list) joined with ``","``,
                                                          every ``$`` removed
=================  ====================================  ======================================================

Answers are otherwise kept verbatim: only GSM8K's, AIME's and Minerva's are stripped (verl's MATH answers
keep the spaces inside the box, and DeepScaleR's upstream answers keep theirs).
A row is dropped -- never silently: the count per reason is on the result's ``dropped`` and logged --
when it is not a mapping, has no usable problem text, or has no usable gold answer (reasons are the
module constants ``NOT_A_MAPPING``, ``MISSING_PROBLEM``, ``MISSING_ANSWER``, ``NO_FINAL_ANSWER``,
``NO_BOXED_ANSWER``, ``NOT_AN_INTEGER``).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# drop reasons (the keys of Normalised.dropped)
NOT_A_MAPPING = "not_a_mapping"
MISSING_PROBLEM = "missing_problem"  # no problem column, or an empty / non-string one
MISSING_ANSWER = "missing_answer"  # no answer column, or an empty one
NO_FINAL_ANSWER = "no_final_answer"  # GSM8K: no "####" line
NO_BOXED_ANSWER = "no_boxed_answer"  # the solution has no complete \boxed{}
NOT_AN_INTEGER = "answer_not_integer"  # AIME: the answer is not an integer

_RECORD_KEYS = frozenset({"id", "problem", "answer", "source"})


class Normalised(list):
    """The records made from one upstream split (a plain ``list`` of dicts) plus what was dropped.

    ``dropped`` maps a reason to the number of upstream rows dropped for it; ``n_raw`` counts the
    upstream rows seen (kept + dropped).
    """

    def __init__(self, rows: Iterable[dict] = (), dropped: Mapping[str, int] | None = None, n_raw: int = 0):
        super().__init__(rows)
        self.dropped: dict[str, int] = dict(sorted((dropped or {}).items()))
        self.n_raw = n_raw

    @property
    def n_dropped(self) -> int:
        return sum(self.dropped.values())


class _Drop(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# \boxed{} extraction, with verl's semantics (last_boxed_only_string + remove_boxed)
# --------------------------------------------------------------------------------------------------


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``, box command included, or None.

    Same rules as verl's ``last_boxed_only_string`` (``verl.utils.reward_score.math``), reimplemented:

    * if ``"\\boxed "`` (the brace-less form) occurs anywhere, the result is ``"\\boxed "`` followed by
      what comes after its last occurrence, up to the next ``$``;
    * otherwise start at the last ``\\boxed`` (else the last ``\\fbox``) and scan forward counting every
      ``{`` and ``}`` (escaped ones too) until the count returns to zero; None if it never does.
    """
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def remove_boxed(boxed: str) -> str | None:
    """The content of a box returned by :func:`last_boxed_only_string` (verl's ``remove_boxed``).

    ``"\\boxed x"`` gives ``"x"``, ``"\\boxed{x}"`` gives ``"x"``. Where verl would fail an assertion
    (a box that is not ``\\boxed{...}``) this returns None, except that ``\\fbox{x}`` gives ``"x"``.
    """
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    for opener in ("\\boxed{", "\\fbox{"):
        if boxed.startswith(opener) and boxed.endswith("}"):
            return boxed[len(opener) : -1]
    return None


def last_boxed_answer(text: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(text))``: the gold answer of a MATH-style solution, or None."""
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A JSON-ready copy: numpy / pyarrow scalars and arrays to Python, NaN to None."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    if hasattr(value, "as_py"):  # pyarrow scalars
        return _plain(value.as_py())
    return str(value)


def _problem(row: Mapping, *columns: str) -> str:
    """The first present problem column, verbatim; a missing, non-string or blank one drops the row."""
    for col in columns:
        if col in row and row[col] is not None:
            value = row[col]
            if isinstance(value, str) and value.strip():
                return value
            raise _Drop(MISSING_PROBLEM)
    raise _Drop(MISSING_PROBLEM)


def _scalar_text(value: Any) -> str | None:
    """A string answer as is, a number as its text (integral floats without ``.0``); else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return None
    value = _plain(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return None


def _answer_column(row: Mapping, column: str = "answer") -> str:
    text = _scalar_text(row.get(column))
    if text is None or not text.strip():
        raise _Drop(MISSING_ANSWER)
    return text


def _as_list(value: Any) -> list | None:
    """A list-valued cell as a list: lists, tuples and arrays; a string holding a JSON / Python list of
    strings; any other non-empty string as a one-item list. None for a missing cell."""
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            for parse in (json.loads, ast.literal_eval):
                try:
                    parsed = parse(text)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
                if isinstance(parsed, list) and all(isinstance(x, str) for x in parsed):
                    return parsed
        return [value]
    return [value]


def _extras(row: Mapping, **columns: str) -> dict:
    """``{record key: row[upstream column]}`` for the upstream columns present."""
    return {key: _plain(row[col]) for key, col in columns.items() if col in row}


def _run(key: str, raw_rows: Iterable[Any], convert: Callable[[Mapping], tuple[str, str, dict]]) -> Normalised:
    """Apply ``convert`` (row -> (problem, answer, extras), or raise _Drop) to every row; count drops."""
    records: list[dict] = []
    dropped: Counter[str] = Counter()
    n_raw = 0
    for index, row in enumerate(raw_rows):
        n_raw += 1
        if not isinstance(row, Mapping):
            dropped[NOT_A_MAPPING] += 1
            continue
        try:
            problem, answer, extras = convert(row)
        except _Drop as drop:
            dropped[drop.reason] += 1
            continue
        record = {"id": f"{key}-{index:05d}", "problem": problem, "answer": answer, "source": key}
        record.update((k, v) for k, v in extras.items() if k not in _RECORD_KEYS)
        records.append(record)
    if dropped:
        log.warning(
            "%s: dropped %d of %d upstream row(s): %s",
            key,
            sum(dropped.values()),
            n_raw,
            ", ".join(f"{reason}={count}" for reason, count in sorted(dropped.items())),
        )
    return Normalised(records, dropped=dropped, n_raw=n_raw)


# --------------------------------------------------------------------------------------------------
# Per-benchmark normalisers
# --------------------------------------------------------------------------------------------------

_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d)")
_INTEGER = re.compile(r"[+-]?\d+")


def normalise_deepscaler(raw_rows: Iterable[Mapping]) -> Normalised:
    """DeepScaleR-Preview (``deepscaler.json``). Reads ``problem``, ``answer``, ``solution``.

    Gold = ``answer`` verbatim; rows whose answer is missing or blank are dropped (``missing_answer``).
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        return _problem(row, "problem"), _answer_column(row), _extras(row, solution="solution")

    return _run("deepscaler", raw_rows, convert)


def normalise_gsm8k(raw_rows: Iterable[Mapping]) -> Normalised:
    """GSM8K. Reads ``question`` and ``answer`` (the worked solution ending in ``#### <number>``).

    Gold = the text after the last ``####``, stripped, with commas between digits removed
    (``"#### 1,234"`` gives ``"1234"``). Extra: ``solution`` = the whole upstream ``answer`` text.
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        problem = _problem(row, "question")
        full = row.get("answer")
        if not isinstance(full, str) or not full.strip():
            raise _Drop(MISSING_ANSWER)
        if "####" not in full:
            raise _Drop(NO_FINAL_ANSWER)
        gold = _DIGIT_COMMA.sub("", full.rsplit("####", 1)[1].strip())
        if not gold:
            raise _Drop(MISSING_ANSWER)
        return problem, gold, {"solution": full}

    return _run("gsm8k", raw_rows, convert)


def normalise_math500(raw_rows: Iterable[Mapping]) -> Normalised:
    """MATH-500. Reads ``problem``, ``answer``, ``solution``, ``subject``, ``level``, ``unique_id``.

    Gold = ``answer`` verbatim (it equals the last ``\\boxed{}`` of ``solution``). Extras: ``solution``,
    ``subject``, ``level``, ``upstream_id`` (= ``unique_id``, e.g. ``test/precalculus/807.json``).
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        extras = _extras(row, solution="solution", subject="subject", level="level", upstream_id="unique_id")
        return _problem(row, "problem"), _answer_column(row), extras

    return _run("math500", raw_rows, convert)


def normalise_lighteval(raw_rows: Iterable[Mapping]) -> Normalised:
    """MATH test in lighteval form. Reads ``problem``, ``solution``, ``level``, ``type``.

    Gold = :func:`last_boxed_answer` of ``solution`` (verl's ``remove_boxed(last_boxed_only_string(.))``),
    verbatim; a solution without a complete box drops the row (``no_boxed_answer``). Extras:
    ``solution``, ``level`` (``"Level 3"``), ``type`` (the subject).
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        problem = _problem(row, "problem")
        solution = row.get("solution")
        if not isinstance(solution, str) or not solution.strip():
            raise _Drop(MISSING_ANSWER)
        gold = last_boxed_answer(solution)
        if gold is None or not gold.strip():
            raise _Drop(NO_BOXED_ANSWER)
        return problem, gold, _extras(row, solution="solution", level="level", type="type")

    return _run("lighteval", raw_rows, convert)


def normalise_aime24(raw_rows: Iterable[Mapping]) -> Normalised:
    """AIME 2024 (HuggingFaceH4/aime_2024). Reads ``problem``, ``answer``, ``solution``, ``url``, ``year``, ``id``.

    Gold = ``answer`` as a string integer: the upstream string, stripped (the Hub copy writes AIME's three
    digits, so ``"025"`` stays ``"025"``; math-verify reads it as 25), or the text of a number (``204`` and
    ``204.0`` give ``"204"``); an answer that is not an integer drops the row (``answer_not_integer``).
    Extras: ``solution``, ``url``, ``year``, ``upstream_id`` (= ``id``).
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        problem = _problem(row, "problem")
        gold = _answer_column(row).strip()  # numbers arrive as their text, integral floats without ".0"
        if not _INTEGER.fullmatch(gold):
            raise _Drop(NOT_AN_INTEGER)
        return problem, gold, _extras(row, solution="solution", url="url", year="year", upstream_id="id")

    return _run("aime24", raw_rows, convert)


def normalise_minerva(raw_rows: Iterable[Mapping]) -> Normalised:
    """Minerva math (math-ai/minervamath). Reads ``question`` (or ``problem``), ``solution`` if present, ``answer``.

    Gold = the last ``\\boxed{}`` of ``solution`` (:func:`last_boxed_answer`), stripped (one box ends in a
    newline). The Hub copy's ``answer`` column already holds that boxed answer (e.g. ``np.arcsin(10/13)``),
    so without a ``solution`` column (or without a box in it) the gold is ``answer``, stripped (and
    unboxed if it is itself boxed; a list gives its first item). Extras:
    ``solution``, ``answer_from`` (``"solution"`` or ``"answer"``), ``type`` (the course) if present.
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        problem = _problem(row, "question", "problem")
        extras = _extras(row, solution="solution", type="type")
        solution = row.get("solution")
        gold = last_boxed_answer(solution) if isinstance(solution, str) else None
        if gold is not None and gold.strip():
            extras["answer_from"] = "solution"
            return problem, gold.strip(), extras
        value = row.get("answer")
        if isinstance(value, list | tuple) or hasattr(value, "tolist"):
            items = _as_list(value) or []
            value = items[0] if items else None
        text = _scalar_text(value)
        if text is not None and "\\boxed" in text:
            text = last_boxed_answer(text) or text
        if text is None or not text.strip():
            has_solution = isinstance(solution, str) and solution.strip()
            raise _Drop(NO_BOXED_ANSWER if has_solution else MISSING_ANSWER)
        extras["answer_from"] = "answer"
        return problem, text.strip(), extras

    return _run("minerva", raw_rows, convert)


def normalise_olympiadbench(raw_rows: Iterable[Mapping]) -> Normalised:
    """OlympiadBench, English open-ended competition maths (math-ai/olympiadbench).

    Reads ``question``, ``final_answer`` (a list of strings such as ``["$\\frac{1}{2 n+2}$"]``; a plain
    string, or a string holding a JSON / Python list, is accepted too), optional ``context`` (prepended
    to the question when non-empty), ``id``, ``solution``, ``unit``, ``answer_type``,
    ``is_multiple_answer``, ``subfield``.

    Gold = the ``final_answer`` items joined with ``","``, with every ``$`` removed. Extras:
    ``final_answer_raw`` (the list), ``solution``, ``unit``, ``answer_type``, ``is_multiple_answer``,
    ``subfield``, ``upstream_id`` (= ``id``).
    """

    def convert(row: Mapping) -> tuple[str, str, dict]:
        problem = _problem(row, "question", "problem")
        context = row.get("context")
        if isinstance(context, str) and context.strip():
            problem = f"{context}\n{problem}"
        items = _as_list(row.get("final_answer"))
        if not items:
            raise _Drop(MISSING_ANSWER)
        gold = ",".join(str(_plain(item)) for item in items).replace("$", "")
        if not gold.strip():
            raise _Drop(MISSING_ANSWER)
        extras = _extras(
            row,
            solution="solution",
            unit="unit",
            answer_type="answer_type",
            is_multiple_answer="is_multiple_answer",
            subfield="subfield",
            upstream_id="id",
        )
        extras["final_answer_raw"] = items
        return problem, gold, extras

    return _run("olympiadbench", raw_rows, convert)


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchmarkSpec:
    """One data set on the Hugging Face Hub and how to normalise it.

    ``config`` is the dataset-card config (None: the repo's ``default``). ``data_files`` are glob patterns
    (relative to the repo root) of the split's files, used when the dataset card declares no
    ``configs``/``data_files`` for this config and split. ``columns`` says which upstream columns are read.
    """

    key: str
    repo_id: str
    config: str | None
    split: str
    data_files: tuple[str, ...]
    columns: str
    normaliser: Callable[[Iterable[Mapping]], Normalised] = field(repr=False, compare=False)
    rows: int = 0  # the split's published size: what the cluster planner prices (calibrl.plan.data_rows)
    role: str = "eval"  # "train" or "eval"

    def normalise(self, raw_rows: Iterable[Mapping]) -> Normalised:
        """Records (a :class:`Normalised` list, with ``dropped`` counts) from upstream rows."""
        return self.normaliser(raw_rows)


_GENERIC_TEST = ("test.jsonl", "test-*.jsonl", "test.json", "test-*.parquet", "data/test-*.parquet", "data/test.*")

BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.key: spec
    for spec in (
        BenchmarkSpec(
            "deepscaler",
            "agentica-org/DeepScaleR-Preview-Dataset",
            None,
            "train",
            ("deepscaler.json", "data/train-*.parquet"),
            "problem, answer, solution",
            normalise_deepscaler,
            rows=40315,
            role="train",
        ),
        BenchmarkSpec(
            "gsm8k",
            "openai/gsm8k",
            "main",
            "test",
            ("main/test-*.parquet",),
            "question, answer (solution ending in '#### <number>')",
            normalise_gsm8k,
            rows=1319,
        ),
        BenchmarkSpec(
            "math500",
            "HuggingFaceH4/MATH-500",
            None,
            "test",
            ("test.jsonl",) + _GENERIC_TEST[1:],
            "problem, solution, answer, subject, level, unique_id",
            normalise_math500,
            rows=500,
        ),
        BenchmarkSpec(
            "lighteval",
            "DigitalLearningGmbH/MATH-lighteval",
            "default",
            "test",
            ("data/test-*.parquet",),
            "problem, level, solution, type",
            normalise_lighteval,
            rows=5000,
        ),
        BenchmarkSpec(
            "aime24",
            "HuggingFaceH4/aime_2024",
            None,
            "train",
            ("data/train-*.parquet", "train.jsonl", "train-*.parquet"),
            "id, problem, solution, answer, url, year",
            normalise_aime24,
            rows=30,
        ),
        BenchmarkSpec(
            "minerva",
            "math-ai/minervamath",
            None,
            "test",
            _GENERIC_TEST,
            "question, answer (the boxed answer), solution if present",
            normalise_minerva,
            rows=272,
        ),
        BenchmarkSpec(
            "olympiadbench",
            "math-ai/olympiadbench",
            None,
            "test",
            _GENERIC_TEST,
            "id, question, final_answer (list), context, solution, unit, answer_type, is_multiple_answer, subfield",
            normalise_olympiadbench,
            rows=675,
        ),
    )
}


def get_spec(key: str) -> BenchmarkSpec:
    """The spec for ``key``; a ``KeyError`` naming the known keys otherwise."""
    try:
        return BENCHMARKS[key]
    except KeyError:
        raise KeyError(f"unknown benchmark {key!r}; known: {', '.join(BENCHMARKS)}") from None


def normalise(key: str, raw_rows: Iterable[Mapping]) -> Normalised:
    """``BENCHMARKS[key].normalise(raw_rows)``."""
    return get_spec(key).normalise(raw_rows)
