"""Reproducing the recording: where a result was computed (calibrl.provenance) and the comparison of a rerun's
per-seed values with the recorded ones (calibrl.report.reproduce), on a few data seeds of the embedded default's
recording (tests/data/recorded_default.csv.gz): against itself it is bitwise identical, with one arm's counts moved
by a training seed's worth it agrees statistically, and with one arm shifted or one seed far off it differs."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrl import analysis_plan as AP
from calibrl import provenance
from calibrl.backends.local.warmstart import warmstart_job
from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.report import reproduce as R
from calibrl.report.power import read_record

REPO = Path(__file__).resolve().parents[1]
RECORDED = Path(__file__).parent / "data" / "recorded_default.csv.gz"
MODEL = "qwen3-tiny-m"
DATA_SEEDS = 4  # of the recording's 24: 8 training seeds, a quarter of the time of all 48


@pytest.fixture(scope="module")
def recorded() -> tuple[pd.DataFrame, AP.Plan]:
    """The recording on the plan's first data seeds, and the plan."""
    plan = AP.load(REPO / "config" / "plan.yaml")
    pp = read_record(RECORDED)
    keep = [s for s in plan.seeds if plan.data_of[s] in plan.data_seeds[:DATA_SEEDS]]
    return pp[pp["seed"].isin(keep)].reset_index(drop=True), plan


def rows_of(rows: list[dict], arm: str) -> list[dict]:
    return [r for r in rows if r["arm"] == arm]


def shifted(pp: pd.DataFrame, arm: str, points: float, seeds=None) -> pd.DataFrame:
    """``arm``'s correct samples raised by ``points`` percent of n on every problem (of ``seeds``), clipped at n."""
    pp = pp.copy()
    rows = (pp["method"] == arm) & (pp["seed"].isin(seeds) if seeds is not None else True)
    up = pp.loc[rows, "correct"] + np.round(points / 100 * pp.loc[rows, "n"]).astype(int)
    pp.loc[rows, "correct"] = np.minimum(up, pp.loc[rows, "n"])
    return pp


def test_the_recording_against_itself_is_bitwise_identical(recorded):
    pp, plan = recorded
    rows = R.compare(pp, pp, plan, MODEL)
    assert len(rows) == len({(a, c.metric, c.splits, c.factor) for c in plan.primaries for a in c.arms})
    assert all(r["seeds"] == 2 * DATA_SEEDS and r["bitwise"] == 1.0 and r["max_abs_diff"] == 0 for r in rows)
    assert all(r["verdict"] == "identical" for r in rows)
    assert R.verdict(rows) == (R.IDENTICAL, 0)
    spreads = [r["spread"] for r in rows if r["arm"] != "base"]  # base over-sharpens against itself: 0 by definition
    assert all(np.isfinite(s) and s > 0 for s in spreads)


def test_a_rerun_of_some_seeds_is_bitwise_identical_on_them(recorded):
    """A rerun of the first data seed alone: its seeds' values are the recording's bit for bit, though the recording
    holds more seeds (a matrix product over more rows rounds some rows differently; per_seed's sums do not)."""
    pp, plan = recorded
    rerun = pp[pp["seed"].isin([s for s in plan.seeds if plan.data_of[s] == plan.data_seeds[0]])]
    rows = R.compare(rerun, pp, plan, MODEL)
    assert all(r["seeds"] == 2 for r in rows)
    assert R.verdict(rows) == (R.IDENTICAL, 0), [R.line(r) for r in rows if r["verdict"] != "identical"]


def test_noise_within_the_spread_agrees_statistically_but_not_bitwise(recorded):
    """DAPO's counts of each data seed's two training seeds exchanged: every seed moves by as much as a training seed
    does (the recorded spread, by definition), and the moves cancel over the seeds."""
    pp, plan = recorded
    other = {}
    for d in plan.data_seeds[:DATA_SEEDS]:
        a, b = [s for s in plan.seeds if plan.data_of[s] == d]
        other |= {a: b, b: a}
    dapo = pp[pp["method"] == "dapo"].sort_values(["seed", "split", "problem"])
    swapped = dapo.assign(seed=dapo["seed"].map(other)).sort_values(["seed", "split", "problem"])
    noisy = pp.copy()
    noisy.loc[dapo.index, "correct"] = swapped["correct"].to_numpy()
    rows = R.compare(noisy, pp, plan, MODEL)
    (moved,) = rows_of(rows, "dapo")
    assert moved["verdict"] == "agrees" and moved["bitwise"] == 0.0
    assert 0 < moved["max_in_spreads"] <= moved["limit_in_spreads"]
    assert all(r["verdict"] == "identical" for r in rows if r["arm"] != "dapo")
    assert R.verdict(rows) == (R.AGREES, 0)


def test_a_systematic_shift_of_one_arm_differs(recorded):
    """GRPO 5 points of n better on every problem of every seed: each seed moves by less than the per-seed limit,
    and the paired t finds the shift."""
    pp, plan = recorded
    rows = R.compare(shifted(pp, "grpo", 5), pp, plan, MODEL)
    moved = {r["claim"]: r for r in rows_of(rows, "grpo") if r["claim"] in ("P1", "P2")}
    assert all(r["verdict"] == "DIFFERS" and r["p"] < R.LEVEL / len(rows) for r in moved.values()), moved
    assert 4 < moved["P2"]["mean_diff"] <= 6.25  # AVG@8 moves with the counts (2 of 32, less the clipping)
    assert all(r["verdict"] == "identical" for r in rows if r["arm"] != "grpo")
    assert R.verdict(rows) == (R.DIFFERS, 1)


def test_one_seed_far_off_differs_though_the_mean_is_within_its_error(recorded):
    pp, plan = recorded
    seed = plan.seeds[0]
    rows = R.compare(shifted(pp, "grpo", 30, [seed]), pp, plan, MODEL)
    p2 = next(r for r in rows if r["claim"] == "P2" and r["arm"] == "grpo")
    assert p2["p"] > R.LEVEL  # one data seed of 4 moved: t = 1 over the data seeds
    assert p2["max_in_spreads"] > p2["limit_in_spreads"] and p2["verdict"] == "DIFFERS"
    assert R.verdict(rows) == (R.DIFFERS, 1)


def test_no_common_seeds_is_its_own_exit_status(recorded):
    pp, plan = recorded
    rows = R.compare(pp.iloc[:0], pp, plan, MODEL)
    assert all(r["seeds"] == 0 and r["verdict"] == "no common seeds" for r in rows)
    assert R.verdict(rows)[1] == 2


def test_the_rerun_is_rounded_as_the_recording_was():
    pp = pd.DataFrame({"modes": [{"a": -1.234567890123}, None]})
    assert R.as_recorded(pp)["modes"][0] == {"a": -1.23456789}
    assert R.as_recorded(R.as_recorded(pp))["modes"][0] == R.as_recorded(pp)["modes"][0]


def test_the_spread_is_pooled_within_data_seeds():
    # data seed 0: 1 and 3 (squares 2), data seed 1: 10 and 14 (squares 8); 2 degrees of freedom
    spread = R.spread(np.array([1.0, 3.0, 10.0, 14.0]), [5, 6, 7, 8], {5: 0, 6: 0, 7: 1, 8: 1})
    assert spread == pytest.approx(np.sqrt(5.0))
    assert np.isnan(R.spread(np.array([1.0, 2.0]), [5, 7], {5: 0, 7: 1}))


def test_the_machines_are_printed_beside_the_recordings(tmp_path):
    record = tmp_path / "rec.csv.gz"
    lines = R.machines(tmp_path, MODEL, record)
    assert "not recorded" in lines[-1]
    here = provenance.machine()
    other = {**here, "cpu_capability": "AVX2" if here["cpu_capability"] != "AVX2" else "AVX512"}  # not this one's
    Path(f"{record}.machine.json").write_text(json.dumps(other))
    assert "cpu_capability" in R.machines(tmp_path, MODEL, record)[-1]
    Path(f"{record}.machine.json").write_text(json.dumps(provenance.machine()))
    assert "expect bitwise identical" in R.machines(tmp_path, MODEL, record)[-1]
    # warm starts made on several machines (power.record_provenance writes a list): each is compared
    several = {"machine": [provenance.machine(), other]}
    Path(f"{record}.machine.json").write_text(json.dumps(several))
    assert "cpu_capability" in R.machines(tmp_path, MODEL, record)[-1]


# ------------------------------------------------------------------------------------------------ provenance
def test_machine_names_the_cpu_its_isa_and_the_torch_build():
    import torch

    m = provenance.machine()
    assert set(m) == {"cpu", "isa", "torch", "cpu_capability", "mkl", "mkldnn", "python", "platform"}
    assert m["torch"] == torch.__version__ and m["cpu"]
    assert m["isa"] == sorted(m["isa"]) and set(m["isa"]) <= set(provenance.ISA)
    assert json.loads(json.dumps(m)) == m  # it goes into JSON files as it is


def test_the_weights_hash_is_stable_and_sees_one_byte(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    (model / "sub" / "extra.bin").write_bytes(b"\x01\x02\x03")
    (model / "config.json").write_text("{}")
    first = provenance.weights_sha256(model)
    assert provenance.weights_sha256(model) == first and len(first) == 64
    (model / "config.json").write_text('{"changed": true}')  # no weights: the hash stays
    assert provenance.weights_sha256(model) == first
    data = bytearray((model / "model.safetensors").read_bytes())
    data[100] ^= 1
    (model / "model.safetensors").write_bytes(bytes(data))
    assert provenance.weights_sha256(model) != first
    with pytest.raises(FileNotFoundError):
        provenance.weights_sha256(tmp_path / "sub-less")


def test_the_warm_starts_info_records_its_weights_and_machine(tmp_path):
    """Two warm starts with the same seed on this machine: the same weights, bit for bit, and their hash recorded."""
    sft = tmp_path / "sft.jsonl"
    write_jsonl(sft, countdown.generate("train", 8, seed=0))
    arch = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}
    params = {"model": MODEL, "arch": arch, "seed": 0, "template": "{problem}:", "on_error": "fail",
              "warmstart": {"steps": 2, "batch_size": 4, "lr": 1e-2, "weight_decay": 0.01}}  # fmt: skip
    infos = []
    for name in ("a", "b"):
        warmstart_job(params, str(sft), str(tmp_path / name / "init"), str(tmp_path / name / "init.json"))
        infos.append(json.loads((tmp_path / name / "init.json").read_text()))
    a, b = infos
    assert a["weights_sha256"] == provenance.weights_sha256(tmp_path / "a" / "init") == b["weights_sha256"]
    assert a["machine"] == provenance.machine() and a["path"] == str((tmp_path / "a" / "init").resolve())


def test_each_primary_claims_reading_is_set_beside_the_recordings(tmp_path):
    """The recorded claims against themselves read the same; a rerun whose P5 reads otherwise says so for that claim
    alone; a rerun without claims says what is missing."""
    committed = RECORDED.parent / "recorded_claims.csv"
    claims = pd.read_csv(committed)
    primaries = claims[claims["role"] == "primary"]["claim"].tolist()
    same = R.readings(committed, committed)
    assert len(same) == len(primaries) and all(text.endswith(": same reading") for text in same)
    moved = claims.copy()
    p5 = moved["claim"].str.startswith("P5:")
    moved.loc[p5, "reading"] = "absent"
    moved.to_csv(tmp_path / "claims.csv", index=False)
    lines = R.readings(tmp_path / "claims.csv", committed)
    assert [text.split(":")[0] for text in lines if text.endswith("reading differs")] == ["claim P5"]
    assert "rerun absent (" in next(text for text in lines if text.startswith("claim P5"))
    assert R.readings(tmp_path / "none.csv", committed) == [f"claims: not compared (no {tmp_path / 'none.csv'})"]
