"""The JSONL record schema: atomic writes, validation, fail and skip modes."""

import json
import logging
import os

import pytest

from calibrl.data.records import DataError, Records, read_jsonl, validate_record, write_jsonl

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
    "wrong_type": (b'{"id": 3, "problem": "p", "answer": "1", "source": "s"}', "'id' must be a string"),
    "bad_verifier": (
        b'{"id": "c", "problem": "p", "answer": "1", "source": "s", "verifier": [1]}',
        "'verifier' must be an object",
    ),
    "duplicate_id": (_line(GOOD[0]).rstrip(b"\n"), "duplicate id 'a' (first on line 1)"),
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


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_skip_mode_drops_and_counts(tmp_path, kind, caplog):
    bad, _ = BAD_ROWS[kind]
    path = _file(tmp_path, bad)
    with caplog.at_level(logging.WARNING, logger="calibrl.data.records"):
        got = read_jsonl(path, on_error="skip")
    assert got == GOOD
    reason = {"nan": "invalid_json", "bad_verifier": "wrong_type"}.get(kind, kind)
    assert got.skipped == {reason: 1}
    assert str(path) in caplog.text and f"{reason}=1" in caplog.text


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
    with pytest.raises(DataError, match=r"mixed\.jsonl:2: invalid JSON"):
        read_jsonl(path)


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


def test_bad_on_error_and_validate_record():
    with pytest.raises(ValueError, match="on_error"):
        read_jsonl("whatever.jsonl", on_error="ignore")
    validate_record(GOOD[0])
    with pytest.raises(DataError, match="missing required key 'source'"):
        validate_record({"id": "a", "problem": "p", "answer": "1"})
    with pytest.raises(DataError):
        validate_record("a string")
