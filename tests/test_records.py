"""The JSONL record schema: atomic writes, validation, fail and skip modes."""

import json
import logging
import os

import pytest

from calibrl.data.records import DataError, Records, read_jsonl, record_problem, write_jsonl

GOOD = [
    {
        "id": "a",
        "problem": "3 7 12 5 -> 15",
        "answer": "15",
        "source": "countdown-train",
        "verifier": {"numbers": [3, 7, 12, 5], "target": 15, "solutions": ["3+12"]},
    },
    {"id": "b", "problem": "What is $\\frac{1}{2}$ of 4? ünïcødé", "answer": "2", "source": "math500"},
]


def _line(record) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode()


def _file(tmp_path, bad: bytes, name="data.jsonl"):
    """GOOD[0], the bad row on line 2, GOOD[1]."""
    path = tmp_path / name
    path.write_bytes(_line(GOOD[0]) + bad + b"\n" + _line(GOOD[1]))
    return path


BAD_ROWS = {
    "invalid_utf8": (b'{"id": "c", "problem": "\xff\xfe bad", "answer": "1", "source": "s"}', "UTF-8"),
    "invalid_json": (b'{"id": "c", "problem": "p", "answer": "1", "source": "s"', "invalid JSON"),
    "nan": (b'{"id": "c", "problem": "p", "answer": NaN, "source": "s"}', "invalid JSON"),
    "not_an_object": (b'["c", "p", "1", "s"]', "JSON object"),
    "missing_key": (b'{"id": "c", "problem": "p", "source": "s"}', "missing required key 'answer'"),
    "empty_key": (b'{"id": "c", "problem": "  ", "answer": "1", "source": "s"}', "'problem' is empty"),
    "empty_answer": (b'{"id": "c", "problem": "p", "answer": "", "source": "s"}', "'answer' is empty"),
    "blank_answer": (b'{"id": "c", "problem": "p", "answer": " \\t ", "source": "s"}', "'answer' is empty"),
    "null_answer": (b'{"id": "c", "problem": "p", "answer": null, "source": "s"}', "'answer' must be a string"),
    "wrong_type": (b'{"id": 3, "problem": "p", "answer": "1", "source": "s"}', "'id' must be a string"),
    "bad_verifier": (
        b'{"id": "c", "problem": "p", "answer": "1", "source": "s", "verifier": [1]}',
        "'verifier' must be an object",
    ),
    "duplicate_id": (_line(GOOD[0]).rstrip(b"\n"), "duplicate id 'a' (first on line 1)"),
}


# the skip reason of the BAD_ROWS whose name is not their reason
REASON = {
    "nan": "invalid_json",
    "bad_verifier": "wrong_type",
    "empty_answer": "empty_key",
    "blank_answer": "empty_key",
    "null_answer": "wrong_type",
}


def test_round_trip(tmp_path):
    path = tmp_path / "deep" / "er" / "out.jsonl"  # parents are created
    assert write_jsonl(path, GOOD) == 2
    got = read_jsonl(path)
    assert isinstance(got, Records) and isinstance(got, list)
    assert got == GOOD and got.skipped == {} and got.n_skipped == 0
    assert "ünïcødé" in path.read_text(encoding="utf-8")  # written as UTF-8, not \u escapes


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "out.jsonl"
    write_jsonl(path, GOOD)
    write_jsonl(path, GOOD[:1])  # overwrite
    assert os.listdir(tmp_path) == ["out.jsonl"]
    assert read_jsonl(path) == GOOD[:1]


def test_write_rejects_bad_records_and_keeps_old_file(tmp_path):
    path = tmp_path / "out.jsonl"
    write_jsonl(path, GOOD)
    before = path.read_bytes()
    for bad in (
        [GOOD[0], {"id": "x"}],
        [GOOD[0], GOOD[0]],
        [{**GOOD[1], "verifier": {"x": float("nan")}}],
        [{**GOOD[1], "verifier": {"x": object()}}],
    ):
        with pytest.raises(DataError, match="out.jsonl"):
            write_jsonl(path, bad)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["out.jsonl"]


def test_write_failure_midway_leaves_no_temp_file(tmp_path):
    def records():
        yield GOOD[0]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_jsonl(tmp_path / "out.jsonl", records())
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_fail_mode_names_file_line_and_problem(tmp_path, kind):
    bad, needle = BAD_ROWS[kind]
    path = _file(tmp_path, bad)
    with pytest.raises(DataError) as info:
        read_jsonl(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: "), message
    assert needle in message, message
    reason = REASON.get(kind, kind)
    assert f"{path}: 1 bad row(s) ({reason}=1); on_error is fail" in message, message


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_skip_mode_drops_and_counts(tmp_path, kind, caplog):
    bad, _ = BAD_ROWS[kind]
    path = _file(tmp_path, bad)
    with caplog.at_level(logging.WARNING, logger="calibrl.data.records"):
        got = read_jsonl(path, on_error="skip")
    assert got == GOOD
    reason = REASON.get(kind, kind)
    assert got.skipped == {reason: 1}
    assert f"{path}: skipped 1 bad row(s): {reason}=1" in caplog.text and f"{path}:2: " in caplog.text


def test_skip_mode_counts_several_reasons(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [
        _line(GOOD[0]),
        b"not json\n",
        b"\xc3\x28\n",
        _line(GOOD[0]),
        _line(GOOD[0]),
        b"\n",
        b"   \n",
        _line({"id": "c", "problem": "p", "answer": "", "source": "s"}),
        _line(GOOD[1]).rstrip(b"\n"),
    ]
    path.write_bytes(b"".join(rows))
    got = read_jsonl(path, on_error="skip")
    assert got == GOOD  # blank lines are ignored, the first of duplicate ids is kept
    assert got.skipped == {"duplicate_id": 2, "empty_key": 1, "invalid_json": 1, "invalid_utf8": 1}
    assert got.n_skipped == 5
    with pytest.raises(DataError, match=r"mixed\.jsonl:2: invalid JSON") as info:
        read_jsonl(path)
    message = str(info.value)  # fail mode reads on: every bad row is counted and named by its line
    assert "5 bad row(s) (duplicate_id=2, empty_key=1, invalid_json=1, invalid_utf8=1)" in message, message
    for lineno, needle in [
        (2, "invalid JSON"),
        (3, "UTF-8"),
        (4, "duplicate id 'a'"),
        (5, "duplicate id 'a'"),
        (8, "'answer' is empty"),
    ]:
        assert f"{path}:{lineno}: " in message and needle in message.split(f"{path}:{lineno}: ")[1], message


def test_the_listing_stops_at_twenty_rows_but_the_count_does_not(tmp_path, caplog):
    path = tmp_path / "many.jsonl"
    path.write_bytes(_line(GOOD[0]) + b"{oops}\n" * 25 + _line(GOOD[1]))
    with pytest.raises(DataError) as info:
        read_jsonl(path)
    message = str(info.value)
    assert "25 bad row(s) (invalid_json=25)" in message and "... and 5 more" in message
    assert f"{path}:21: " in message and f"{path}:22: " not in message
    with caplog.at_level(logging.WARNING, logger="calibrl.data.records"):
        assert read_jsonl(path, on_error="skip") == GOOD
    assert "skipped 25 bad row(s): invalid_json=25" in caplog.text and "... and 5 more" in caplog.text


# Gold answers math-verify cannot parse (found with calibrl.grading.gold_check): no response could be graded.
UNPARSEABLE_GOLDS = ["$$", "\\boxed{}", "\\text{}", "\\"]


@pytest.mark.parametrize("gold", UNPARSEABLE_GOLDS)
def test_unparseable_gold_answers_fail_or_are_skipped(tmp_path, gold, caplog):
    row = {"id": "c", "problem": "p", "answer": gold, "source": "s"}
    path = _file(tmp_path, _line(row).rstrip(b"\n"))
    assert read_jsonl(path) == [GOOD[0], row, GOOD[1]]  # not checked unless asked
    with pytest.raises(DataError) as info:
        read_jsonl(path, check_golds=True)
    message = str(info.value)
    assert message.startswith(f"{path}:2: gold answer {gold!r} does not parse with math-verify"), message
    assert "1 bad row(s) (unparseable_gold=1)" in message
    with caplog.at_level(logging.WARNING, logger="calibrl.data.records"):
        got = read_jsonl(path, on_error="skip", check_golds=True)
    assert got == GOOD and got.skipped == {"unparseable_gold": 1}
    assert "unparseable_gold=1" in caplog.text and f"{path}:2: gold answer" in caplog.text


def test_parseable_golds_pass_the_check(tmp_path):
    golds = ["15", "-3", "\\frac{1}{2}", "2\\sqrt{3}", "(1, 2)", "x^2 + 1", "\\text{(B)}", "10\\%", "\\infty"]
    rows = [{"id": str(i), "problem": "p", "answer": g, "source": "s"} for i, g in enumerate(golds)]
    path = tmp_path / "golds.jsonl"
    write_jsonl(path, rows)
    assert read_jsonl(path, check_golds=True) == rows


def test_every_kind_of_bad_row_at_once_with_golds_checked(tmp_path):
    """The four kinds of issue 6 -- missing or empty answers, duplicate ids, bytes that are not UTF-8, gold
    answers that do not parse -- in one file: fail names the first and counts all; skip keeps the good rows."""
    path = tmp_path / "all.jsonl"
    path.write_bytes(
        _line(GOOD[0])
        + b'{"id": "m", "problem": "p", "source": "s"}\n'
        + b'{"id": "e", "problem": "p", "answer": "", "source": "s"}\n'
        + _line(GOOD[0])
        + b'{"id": "u", "problem": "\xff", "answer": "1", "source": "s"}\n'
        + _line({"id": "g", "problem": "p", "answer": "$$", "source": "s"})
        + _line(GOOD[1])
    )
    with pytest.raises(DataError) as info:
        read_jsonl(path, check_golds=True)
    message = str(info.value)
    assert message.startswith(f"{path}:2: missing required key 'answer'"), message
    counts = "duplicate_id=1, empty_key=1, invalid_utf8=1, missing_key=1, unparseable_gold=1"
    assert f"5 bad row(s) ({counts})" in message
    assert all(f"{path}:{n}: " in message for n in range(2, 7))
    got = read_jsonl(path, on_error="skip", check_golds=True)
    assert got == GOOD and got.n_skipped == 5


def test_line_numbers_count_blank_lines_and_crlf(tmp_path):
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _line(GOOD[0]).replace(b"\n", b"\r\n") + b"\r\n" + b"{oops}\r\n")
    with pytest.raises(DataError, match=r"crlf\.jsonl:3: invalid JSON"):
        read_jsonl(path)
    path.write_bytes(b"\xef\xbb\xbf" + _line(GOOD[0]).replace(b"\n", b"\r\n"))  # BOM and CRLF are fine
    assert read_jsonl(path) == GOOD[:1]


def test_unicode_line_separators_do_not_split_rows(tmp_path):
    record = {**GOOD[1], "problem": "a\u2028b\x85c"}
    path = tmp_path / "u.jsonl"
    write_jsonl(path, [record])
    assert read_jsonl(path) == [record]


def test_bad_on_error_and_record_problem():
    with pytest.raises(ValueError, match="on_error"):
        read_jsonl("whatever.jsonl", on_error="ignore")
    assert record_problem(GOOD[0]) is None
    assert "missing required key 'source'" in record_problem({"id": "a", "problem": "p", "answer": "1"})[1]
    assert record_problem("a string") is not None
    with pytest.raises(DataError, match="missing required key 'source'"):  # what a writer does with it
        write_jsonl("never.jsonl", [{"id": "a", "problem": "p", "answer": "1"}])
