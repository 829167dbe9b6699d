"""Definition 2.1 measured exactly (calibrl.modes): teacher forcing gives the sampler's own probabilities, a mode's
probability sums its written forms, and the evaluation job records every problem's modes."""

import json
import math

import numpy as np
import pytest
import torch

from calibrl import modes
from calibrl.data import countdown
from calibrl.models import build_model, build_tokenizer
from calibrl.sampling import sample
from calibrl.tasks import format_prompt

ARCH = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}


def test_written_forms_of_a_mode():
    assert modes.written("3+12") == ["3+12", "12+3"]
    assert modes.written("3*5") == ["3*5", "5*3"]
    assert modes.written("4*4") == ["4*4"]
    assert modes.written("20-5") == ["20-5"]
    with pytest.raises(ValueError, match="not a canonical countdown answer"):
        modes.written("12+3")


def test_teacher_forcing_gives_the_samplers_probability_of_each_finished_response():
    """The log-probability the sampler drew a finished response with (temperature 1, no truncation), summed over
    its tokens and the end of sequence, equals the teacher-forced one, in a padded batch of mixed lengths."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=3, **ARCH).eval()
    prompts = ["3 7 12 5 -> 15:", "1 2 3 4 5 -> 9:"]
    roll = sample(model, tok, prompts, 64, 6, generator=torch.Generator().manual_seed(1))
    ended = roll.response_mask.sum(-1) < roll.response_mask.shape[1]  # finished with <eos> inside the budget
    special = set(tok.all_special_ids) - {tok.eos_token_id}  # dropped by decoding: the text is not what was drawn
    rows = [i for i in torch.nonzero(ended).flatten().tolist()
            if not special & set(roll.responses[i][roll.response_mask[i]].tolist())]  # fmt: skip
    assert len(rows) >= 5, len(rows)
    drawn = (roll.logprobs * roll.response_mask).sum(-1)[rows].double()
    forced = modes.sequence_logprobs(model, tok, [prompts[i // 64] for i in rows], [roll.texts[i] for i in rows], 7)
    assert torch.allclose(forced, drawn, atol=1e-4), (forced - drawn).abs().max()


def test_a_modes_probability_sums_its_written_forms_and_suppression_follows_definition_2_1():
    tok = build_tokenizer()
    model = build_model(tok, seed=4, **ARCH).eval()
    record = countdown.generate("test", 20, seed=0)[0]
    assert len(record["verifier"]["solutions"]) >= 1
    (got,) = modes.mode_logprobs(model, tok, [record], "{problem}:")
    assert sorted(got) == sorted(record["verifier"]["solutions"])
    prompt = format_prompt(record, "{problem}:")
    for mode, value in got.items():
        forms = modes.written(mode)
        each = modes.sequence_logprobs(model, tok, [prompt] * len(forms), forms)
        assert value == pytest.approx(float(torch.logsumexp(each, 0)), abs=1e-9)
    ref = {"3+12": -1.0, "3*5": -2.0}
    assert modes.suppressed({"3+12": -0.5, "3*5": -1.0}, ref) == 0  # moderate sharpening: every mode rose
    assert modes.suppressed({"3+12": -0.5, "3*5": -2.5}, ref) == 0.5  # over-sharpening: one mode fell
    with pytest.raises(ValueError, match="different modes"):
        modes.suppressed({"3+12": -0.5}, ref)


def test_the_evaluation_job_records_every_problems_modes(tmp_path):
    """evaluate_base_job with the embedded default's evaluation (countdown, local evaluator): per problem, the
    log-probability of each correct mode, the base model's reference for Definition 2.1."""
    from conftest import filled

    from calibrl import grid as G
    from calibrl.data.records import write_jsonl
    from calibrl.evaluate import evaluate_base_job
    from calibrl.models import save

    config = filled("config")
    params = {**G.base_params(config, 0), "settings": {**G.eval_params(config)["settings"], "n": 2, "k": 2}}
    assert params["modes"] is True
    assert "modes" not in G.eval_params({"grid": {**config["grid"], "evaluator": "vllm"}})  # nothing new measured
    tok = build_tokenizer()
    save(build_model(tok, seed=5, **ARCH), tok, tmp_path / "base")
    (tmp_path / "base.json").write_text(json.dumps({"path": str(tmp_path / "base")}))
    records = countdown.generate("test", 6, seed=0)
    write_jsonl(tmp_path / "test.jsonl", records)
    out = tmp_path / "step_0.json"
    evaluate_base_job(params, str(tmp_path / "base.json"), {"test": str(tmp_path / "test.jsonl")}, str(out), workers=0)
    got = json.loads(out.read_text())["splits"]["test"]["per_problem"]["modes"]
    assert [sorted(m) for m in got] == [sorted(r["verifier"]["solutions"]) for r in records]
    assert all(np.isfinite(v) and v < 0 for m in got for v in m.values())


def test_the_readings_split_an_over_sharpened_problem_into_reallocated_and_declined():
    """Over-sharpened (a correct mode below half its reference) is reallocated when another correct mode rose and
    declined when none did; a problem neither is not over-sharpened."""
    half = math.log(0.5)
    ref = {"1+2": -1.0, "3-0": -2.0}
    cases = {
        "reallocated": {"1+2": -1.0 + 2 * half, "3-0": -1.5},  # one halved twice over, the other rose
        "declined": {"1+2": -1.0 + 2 * half, "3-0": -2.1},  # one halved twice over, the other fell a little
        "neither": {"1+2": -1.0 + 0.5 * half, "3-0": -1.0},  # no mode below half its reference
    }
    for name, new in cases.items():
        got = {kind: modes.reading(kind, new, ref, 0.5) for kind in modes.READINGS}
        assert got["oversharpened"] == (name != "neither"), name
        assert got["reallocated"] == (name == "reallocated") and got["declined"] == (name == "declined"), name
    with pytest.raises(ValueError, match="unknown reading"):
        modes.reading("collapsed", ref, ref)
