"""Benchmark normalisation (calibrl.data.benchmarks) and Hub download (calibrl.data.hub), without network.

The normalisers are checked against real copies of the benchmarks in ``../shared/data`` (skipped when that
folder is absent): each shared file is turned back into its upstream Hugging Face column layout, normalised,
and the gold answers are compared with the ones recorded there.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from calibrl.data import benchmarks as bm
from calibrl.data import hub
from calibrl.data.benchmarks import BENCHMARKS, last_boxed_answer, last_boxed_only_string, remove_boxed
from calibrl.data.hub import DataUnavailable, download, read_rows, select_data_files
from calibrl.data.records import DataError, read_jsonl

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BENCH = SHARED / "benchmarks"
DSR = SHARED / "deepscaler-partial"
SHA = "0123456789abcdef0123456789abcdef01234567"


def _load(path: Path) -> list[dict]:
    if not path.is_file():
        pytest.skip(f"shared data file {path} is absent")
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# --------------------------------------------------------------------------------------------------
# Upstream layouts rebuilt from the shared copies: key -> (upstream rows, gold answers, row count)
# --------------------------------------------------------------------------------------------------


def _num(shared_id: str) -> int:
    return int(shared_id.rsplit("-", 1)[1])


def upstream_gsm8k():
    rows = _load(BENCH / "gsm8k_test.jsonl")  # solution = the upstream "answer" text, ending "#### 18"
    return [{"question": r["problem"], "answer": r["solution"]} for r in rows], [r["answer"] for r in rows]


def upstream_math500():
    rows = _load(BENCH / "math500.jsonl")
    cols = ("problem", "solution", "answer", "subject", "level")
    return [{**{c: r[c] for c in cols}, "unique_id": r["id"]} for r in rows], [r["answer"] for r in rows]


def upstream_lighteval():
    # The shared copy keeps no solutions: rebuild one that boxes the recorded answer the way MATH does.
    rows = _load(BENCH / "math_lighteval_test.jsonl")
    up = [
        {
            "problem": r["problem"],
            "level": r["level"],
            "type": r["type"],
            "solution": f"Working omitted, so $x = 1$ and $\\{{a\\}}$.  Thus the answer is $\\boxed{{{r['answer']}}}$.",
        }
        for r in rows
    ]
    return up, [r["answer"] for r in rows]


def upstream_aime24():
    rows = _load(BENCH / "aime24.jsonl")
    up = [
        {
            "id": _num(r["id"]),
            "problem": r["problem"],
            "solution": r["solution"],
            "answer": r["answer"],
            "url": r["url"],
            "year": "2024",
        }
        for r in rows
    ]
    return up, [r["answer"] for r in rows]


def upstream_minerva():
    rows = _load(BENCH / "minerva_math.jsonl")
    # The gold is the solution's last box; the "answer" column is set to another copy's first hand-written
    # answer (different in 131 rows) to prove it is not what is read when a solution is present.
    up = [
        {
            "question": r["problem"],
            "solution": r["solution"],
            "answer": r["answer_alternatives_deepscaler"][0],
            "type": r["type"],
        }
        for r in rows
    ]
    return up, [r["answer"] for r in rows]


def upstream_olympiadbench():
    rows = _load(BENCH / "olympiadbench.jsonl")
    cols = ("is_multiple_answer", "unit", "answer_type", "subfield")
    up = [
        {
            "id": _num(r["id"]),
            "question": r["problem"],
            "final_answer": r["final_answer_raw"],
            "context": None,
            **{c: r[c] for c in cols},
        }
        for r in rows
    ]
    return up, [r["answer"] for r in rows]


def upstream_deepscaler():
    rows = []
    for name in (
        "deepscaler_partial_aime_math",
        "deepscaler_subset803_metareason",
        "deepscaler_subset_manhitv_train",
        "deepscaler_subset_manhitv_val",
    ):
        rows += _load(DSR / f"{name}.jsonl")
    up = [{"problem": r["problem"], "answer": r["answer"], "solution": r.get("solution")} for r in rows]
    return up, [r["answer"] for r in rows]


UPSTREAM = {
    "deepscaler": upstream_deepscaler,
    "gsm8k": upstream_gsm8k,
    "math500": upstream_math500,
    "lighteval": upstream_lighteval,
    "aime24": upstream_aime24,
    "minerva": upstream_minerva,
    "olympiadbench": upstream_olympiadbench,
}

# key -> (rows, matching gold answers, dropped rows). Everything matches, except that DeepScaleR's two
# source parts in deepscaler_partial_aime_math.jsonl hold 2 multiple-choice rows with an empty answer
# (README: DeepScaleR's own filter drops them), which the normaliser drops and counts.
EXPECTED = {
    "deepscaler": (11352, 11350, {"missing_answer": 2}),
    "gsm8k": (1319, 1319, {}),
    "math500": (500, 500, {}),
    "lighteval": (5000, 5000, {}),
    "aime24": (30, 30, {}),
    "minerva": (272, 272, {}),
    "olympiadbench": (675, 675, {}),
}


def test_registry():
    assert list(BENCHMARKS) == ["deepscaler", "gsm8k", "math500", "lighteval", "aime24", "minerva", "olympiadbench"]
    ids = {k: (s.repo_id, s.config, s.split) for k, s in BENCHMARKS.items()}
    assert ids["gsm8k"] == ("openai/gsm8k", "main", "test")
    assert ids["math500"] == ("HuggingFaceH4/MATH-500", None, "test")
    assert ids["lighteval"] == ("DigitalLearningGmbH/MATH-lighteval", "default", "test")
    assert ids["aime24"] == ("HuggingFaceH4/aime_2024", None, "train")
    assert ids["minerva"] == ("math-ai/minervamath", None, "test")
    assert ids["olympiadbench"] == ("math-ai/olympiadbench", None, "test")
    assert ids["deepscaler"] == ("agentica-org/DeepScaleR-Preview-Dataset", None, "train")
    assert set(UPSTREAM) == set(BENCHMARKS) == set(EXPECTED)


@pytest.mark.parametrize("key", list(UPSTREAM))
def test_normaliser_reproduces_shared_gold(key):
    up, gold = UPSTREAM[key]()
    if key == "minerva":
        assert sum(u["answer"] != g for u, g in zip(up, gold)) == 131
    records = BENCHMARKS[key].normalise(up)
    n_rows, n_match, dropped = EXPECTED[key]
    assert len(up) == n_rows
    if BENCHMARKS[key].role == "eval":  # the size the cluster planner prices is the real split's
        assert BENCHMARKS[key].rows == n_rows
    assert records.n_raw == n_rows and records.dropped == dropped
    assert len(records) == n_rows - sum(dropped.values())
    got = {int(r["id"].rsplit("-", 1)[1]): r["answer"] for r in records}  # ids carry the upstream row index
    matches = sum(got.get(i) == g for i, g in enumerate(gold))
    print(f"{key}: gold answers reproduced for {matches}/{n_rows} rows ({100 * matches / n_rows:.2f}%)")
    assert matches == n_match, [(i, got.get(i), g) for i, g in enumerate(gold) if got.get(i) != g][:5]
    for r in records:
        assert r["source"] == key and r["id"].startswith(f"{key}-") and r["problem"].strip() and r["answer"].strip()
    assert len({r["id"] for r in records}) == len(records)


def test_lighteval_boxes_of_real_math_solutions():
    """MATH-500's full solutions, boxed answer extracted as for lighteval, equal the lighteval gold of the
    same problems (MATH-500 is a subset of the MATH test set) and MATH-500's own answers."""
    m500 = _load(BENCH / "math500.jsonl")
    light = {r["problem"]: r["answer"] for r in _load(BENCH / "math_lighteval_test.jsonl")}
    records = bm.normalise_lighteval({"problem": r["problem"], "solution": r["solution"]} for r in m500)
    assert len(records) == 500
    assert sum(r["answer"] == light.get(r["problem"]) for r in records) == 500
    assert [r["answer"] for r in records] == [r["answer"] for r in m500]


def test_minerva_answer_column_only():
    """Without a solution column the gold is the Hub copy's answer column (the boxed answer)."""
    rows = _load(BENCH / "minerva_math.jsonl")
    records = bm.normalise_minerva({"question": r["problem"], "answer": r["answer"]} for r in rows)
    assert [r["answer"] for r in records] == [r["answer"] for r in rows]
    assert {r["answer_from"] for r in records} == {"answer"}
    boxed = bm.normalise_minerva([{"question": "q", "answer": "so \\boxed{4.5e33}"}])
    assert boxed[0]["answer"] == "4.5e33"


def test_olympiadbench_final_answer_forms():
    rows = _load(BENCH / "olympiadbench.jsonl")
    forms = []
    for i, r in enumerate(rows):
        raw = r["final_answer_raw"]
        if i % 3 == 0:
            fa = json.dumps(raw)  # a JSON-encoded list
        elif i % 3 == 1 and len(raw) == 1:
            fa = raw[0]  # a plain string
        else:
            fa = tuple(raw)
        forms.append({"question": r["problem"], "final_answer": fa})
    records = bm.normalise_olympiadbench(forms)
    assert [r["answer"] for r in records] == [r["answer"] for r in rows]
    assert sum("," in r["answer"] for r in records) >= 94  # the multi-answer rows are joined
    # an interval written as a string stays one answer
    assert bm.normalise_olympiadbench([{"question": "q", "final_answer": "$[0,1]$"}])[0]["answer"] == "[0,1]"


def test_bad_rows_are_dropped_and_counted():
    rows = [
        {"question": "q1", "answer": "a\n#### 1,234"},
        {"question": "", "answer": "#### 2"},
        {"answer": "#### 3"},
        {"question": "q4", "answer": "no marker"},
        {"question": "q5", "answer": None},
        "not a row",
        {"question": "q7", "answer": "x\n#### -5"},
    ]
    out = bm.normalise_gsm8k(rows)
    assert [(r["id"], r["answer"]) for r in out] == [("gsm8k-00000", "1234"), ("gsm8k-00006", "-5")]
    assert out.dropped == {"missing_answer": 1, "missing_problem": 2, "no_final_answer": 1, "not_a_mapping": 1}
    assert out.n_raw == 7 and out.n_dropped == 5
    aime = bm.normalise_aime24(
        [{"problem": "p", "answer": 33}, {"problem": "p", "answer": 204.0}, {"problem": "p", "answer": "1/2"}]
    )
    assert [r["answer"] for r in aime] == ["33", "204"] and aime.dropped == {"answer_not_integer": 1}
    light = bm.normalise_lighteval([{"problem": "p", "solution": "no box"}, {"problem": "p", "solution": "\\boxed{1"}])
    assert len(light) == 0 and light.dropped == {"no_boxed_answer": 2}
    dsr = bm.normalise_deepscaler([{"problem": "p", "answer": ""}, {"problem": "p", "answer": "  "}])
    assert dsr.dropped == {"missing_answer": 2}


def test_boxed_extraction_semantics():
    assert last_boxed_answer("a $\\boxed{1}$ then $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert last_boxed_answer("$\\boxed{\\{1,2\\}}$") == "\\{1,2\\}"
    assert last_boxed_answer("$\\boxed{ \\frac{1}{8}}$") == " \\frac{1}{8}"  # kept verbatim, as verl
    assert last_boxed_answer("so \\fbox{7} done") == "7"
    assert last_boxed_answer("unclosed \\boxed{3") is None
    assert last_boxed_answer("nothing") is None
    # verl's brace-less form wins whenever "\boxed " occurs, and stops at the next "$"
    assert last_boxed_only_string("$\\boxed 5$ and \\boxed{6}") == "\\boxed 5"
    assert last_boxed_answer("$\\boxed 5$ and \\boxed{6}") == "5"
    assert remove_boxed("\\boxed{x}") == "x" and remove_boxed("\\boxedx") is None


def test_extras_are_json_ready():
    import numpy as np

    out = bm.normalise_olympiadbench(
        [{"question": "q", "final_answer": np.array(["$1$", "$2$"]), "id": np.int64(5), "unit": float("nan")}]
    )
    assert out[0]["answer"] == "1,2" and out[0]["upstream_id"] == 5 and out[0]["unit"] is None
    assert out[0]["final_answer_raw"] == ["$1$", "$2$"]
    json.dumps(out[0], allow_nan=False)


# --------------------------------------------------------------------------------------------------
# File selection and reading
# --------------------------------------------------------------------------------------------------


def test_select_data_files():
    gsm = BENCHMARKS["gsm8k"]
    names = [
        "README.md",
        "main/test-00000-of-00001.parquet",
        "main/train-00000-of-00001.parquet",
        "socratic/test-00000-of-00001.parquet",
    ]
    assert select_data_files(gsm, names) == ["main/test-00000-of-00001.parquet"]
    card = [{"config_name": "main", "data_files": [{"split": "test", "path": "main/test-*"}]}]
    assert select_data_files(gsm, names, card) == ["main/test-00000-of-00001.parquet"]
    oly = BENCHMARKS["olympiadbench"]
    card = [{"config_name": "default", "data_files": [{"split": "test", "path": "test*"}]}]
    assert select_data_files(oly, ["README.md", "test.jsonl", ".gitattributes"], card) == ["test.jsonl"]
    assert select_data_files(oly, ["odd/name.parquet"]) == ["odd/name.parquet"]  # the only data file
    assert select_data_files(oly, ["a/train.jsonl", "a/validation.jsonl"]) == []
    dsr = BENCHMARKS["deepscaler"]
    assert select_data_files(dsr, ["README.md", "deepscaler.json"]) == ["deepscaler.json"]
    aime = BENCHMARKS["aime24"]
    assert select_data_files(aime, ["data/train-00000-of-00001.parquet", "README.md"]) == [
        "data/train-00000-of-00001.parquet"
    ]


def test_read_rows_formats(tmp_path):
    rows = [{"a": 1, "b": ["x"]}, {"a": 2, "b": []}]
    (tmp_path / "x.json").write_text(json.dumps(rows))
    (tmp_path / "y.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "z.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (tmp_path / "w.json").write_text("\n".join(json.dumps(r) for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "v.parquet")
    for name in ("x.json", "y.json", "z.jsonl", "w.json", "v.parquet"):
        assert read_rows(tmp_path / name) == rows, name


# --------------------------------------------------------------------------------------------------
# download(): local files, a mocked Hub, the cache, and no network
# --------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_local_parquet(tmp_path):
    up, gold = upstream_gsm8k()
    src = tmp_path / "gsm8k-test.parquet"
    pq.write_table(pa.Table.from_pylist(up), src)
    out, man = tmp_path / "out" / "gsm8k.jsonl", tmp_path / "out" / "gsm8k.manifest.json"
    manifest = download("gsm8k", out, man, local_files=str(src))
    records = read_jsonl(out)
    assert [r["answer"] for r in records] == gold
    assert records[12]["id"] == "gsm8k-00012" and records[0]["source"] == "gsm8k"
    saved = json.loads(man.read_text())
    assert saved == manifest
    assert manifest["jsonl"]["sha256"] == _sha256(out) and manifest["jsonl"]["rows"] == 1319
    assert manifest["rows_read"] == manifest["rows_written"] == 1319 and manifest["dropped"] == {}
    assert manifest["files"] == [{"name": src.name, "sha256": _sha256(src), "rows": 1319}]
    assert manifest["origin"] == "local_files" and manifest["revision"] is None
    assert (manifest["repo_id"], manifest["config"], manifest["split"]) == ("openai/gsm8k", "main", "test")


def test_download_local_directories(tmp_path):
    # an HF-style copy of math-ai/olympiadbench: a dataset card naming test* and one test.jsonl
    up, gold = upstream_olympiadbench()
    repo = tmp_path / "olympiadbench"
    repo.mkdir()
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: test\n    path: test*\n---\n# OlympiadBench\n"
    )
    (repo / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in up))
    (repo / "train_notes.jsonl").write_text('{"question": "not this one"}\n')
    manifest = download("olympiadbench", tmp_path / "o.jsonl", tmp_path / "o.json", local_files=str(repo))
    assert [f["name"] for f in manifest["files"]] == ["test.jsonl"]
    assert [r["answer"] for r in read_jsonl(tmp_path / "o.jsonl")] == gold
    # DeepScaleR's deepscaler.json is one JSON array; its empty answers are dropped and counted
    up, _ = upstream_deepscaler()
    repo = tmp_path / "dsr"
    repo.mkdir()
    (repo / "deepscaler.json").write_text(json.dumps(up))
    manifest = download("deepscaler", tmp_path / "d.jsonl", tmp_path / "d.json", local_files=str(repo))
    assert manifest["rows_read"] == 11352 and manifest["rows_written"] == 11350
    assert manifest["dropped"] == {"missing_answer": 2}
    with pytest.raises(DataUnavailable, match=r"grid\.data\.local_files\.minerva"):
        download("minerva", tmp_path / "m.jsonl", tmp_path / "m.json", local_files=str(tmp_path / "nope"))


def _fake_hub(monkeypatch, cache: Path, upstream: list[dict]) -> list[dict]:
    """Replace the Hub with a fake dataset_info / snapshot_download serving a gsm8k-like repo."""
    import huggingface_hub

    calls: list[dict] = []
    files = [
        "README.md",
        "main/test-00000-of-00001.parquet",
        "main/train-00000-of-00001.parquet",
        "socratic/test-00000-of-00001.parquet",
    ]
    card = {"configs": [{"config_name": "main", "data_files": [{"split": "test", "path": "main/test-*"}]}]}

    def dataset_info(self, repo_id, *, revision=None, timeout=None, **kw):
        calls.append({"fn": "dataset_info", "repo_id": repo_id, "revision": revision, "timeout": timeout})
        return SimpleNamespace(sha=SHA, card_data=card, siblings=[SimpleNamespace(rfilename=f) for f in files])

    def snapshot_download(*, repo_id, repo_type, revision, allow_patterns, cache_dir, **kw):
        calls.append({"fn": "snapshot_download", "revision": revision, "allow_patterns": allow_patterns, **kw})
        folder = Path(cache_dir) / f"datasets--{repo_id.replace('/', '--')}" / "snapshots" / revision
        (folder / "main").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(upstream), folder / "main" / "test-00000-of-00001.parquet")
        (folder / "README.md").write_text("---\n" + json.dumps(card) + "\n---\n")
        return str(folder)

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return calls


def test_download_from_hub_then_offline_from_cache(tmp_path, monkeypatch):
    up, gold = upstream_gsm8k()
    up = up[:40]
    cache = tmp_path / "cache"
    calls = _fake_hub(monkeypatch, cache, up)
    manifest = download("gsm8k", tmp_path / "g.jsonl", tmp_path / "g.json", cache_dir=str(cache))
    assert [c["fn"] for c in calls] == ["dataset_info", "snapshot_download"]
    assert calls[0]["revision"] is None and 0 < calls[0]["timeout"] <= 10
    assert calls[1]["revision"] == SHA  # the resolved commit, not the branch
    assert calls[1]["allow_patterns"] == ["main/test-00000-of-00001.parquet", "README.md"]
    assert manifest["origin"] == "hub" and manifest["revision"] == SHA and manifest["revision_requested"] is None
    assert [r["answer"] for r in read_jsonl(tmp_path / "g.jsonl")] == gold[:40]
    assert (cache / "datasets--openai--gsm8k" / "refs" / "main").read_text() == SHA

    # offline now: the real huggingface_hub resolves main -> SHA from the cache, no Hub call is made
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = download("gsm8k", tmp_path / "h.jsonl", tmp_path / "h.json", cache_dir=str(cache))
    assert again["origin"] == "hf-cache" and again["revision"] == SHA
    assert again["jsonl"]["sha256"] == manifest["jsonl"]["sha256"] == _sha256(tmp_path / "h.jsonl")
    with pytest.raises(DataUnavailable, match="openai/gsm8k"):
        download("gsm8k", tmp_path / "i.jsonl", tmp_path / "i.json", cache_dir=str(cache), revision="v2")


def _check_unavailable(exc: DataUnavailable, key: str, repo: str) -> None:
    msg = str(exc)
    assert repo in msg and f"grid.data.local_files.{key}" in msg
    assert "huggingface-cli download --repo-type dataset" in msg


def test_offline_without_cache_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    t0 = time.monotonic()
    with pytest.raises(DataUnavailable) as info:
        download("gsm8k", tmp_path / "g.jsonl", tmp_path / "g.json", cache_dir=str(empty))
    assert time.monotonic() - t0 < 10
    _check_unavailable(info.value, "gsm8k", "openai/gsm8k")
    assert not (tmp_path / "g.jsonl").exists() and not (tmp_path / "g.json").exists()


def _hub_reachable() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(_hub_reachable(), reason="huggingface.co is reachable here; this test needs a closed network")
def test_no_network_fails_fast(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    t0 = time.monotonic()
    with pytest.raises(DataUnavailable) as info:
        download("gsm8k", tmp_path / "g.jsonl", tmp_path / "g.json", cache_dir=str(empty))
    assert time.monotonic() - t0 < 30
    _check_unavailable(info.value, "gsm8k", "openai/gsm8k")
    assert "cannot be reached" in str(info.value)


def test_hub_timeout_is_short():
    assert 0 < hub.HUB_TIMEOUT <= 10


# --------------------------------------------------------------------------------------------------
# math-verify accepts every gold answer as correct against itself
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(UPSTREAM))
def test_math_verify_grades_gold_against_itself(key):
    from calibrl.grading import grade_one

    up, _ = UPSTREAM[key]()
    records = BENCHMARKS[key].normalise(up)
    sample = random.Random(0).sample(list(records), min(50, len(records)))
    failures = []
    for r in sample:
        grade = grade_one(f"The answer is $\\boxed{{{r['answer']}}}$.", r["answer"])
        if not grade.correct:
            failures.append((r["id"], r["answer"], grade))
    print(f"{key}: math-verify accepts {len(sample) - len(failures)}/{len(sample)} sampled gold answers")
    assert not failures, failures[:5]


def test_unparseable_gold_answers_fail_or_are_dropped(tmp_path):
    """A gold answer math-verify cannot parse could never be graded: the download names each one (file,
    line, id) and fails by default; with on_error skip it drops and counts them."""
    up, gold = upstream_gsm8k()
    up = up[:40]
    for i in (3, 17):
        up[i] = {**up[i], "answer": up[i]["answer"].rsplit("####", 1)[0] + "#### $$"}
    src = tmp_path / "gsm8k-test.parquet"
    pq.write_table(pa.Table.from_pylist(up), src)
    out = tmp_path / "gsm8k.jsonl"
    with pytest.raises(DataError) as err:
        download("gsm8k", out, tmp_path / "m.json", local_files=str(src))
    msg = str(err.value)
    assert "2 gold answers math-verify cannot parse" in msg and "grid.data.on_error is fail" in msg
    assert f"{out}:4 (id gsm8k-00003)" in msg and f"{out}:18 (id gsm8k-00017)" in msg
    assert not out.exists()
    manifest = download("gsm8k", out, tmp_path / "m.json", local_files=str(src), on_error="skip")
    assert manifest["dropped"] == {"unparseable_gold": 2} and manifest["rows_written"] == 38
    assert [r["answer"] for r in read_jsonl(out)] == [g for i, g in enumerate(gold[:40]) if i not in (3, 17)]
