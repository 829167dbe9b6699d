"""The paper-scale jobs on CPU: what the OpenRLHF runs of config/paper.yaml receive (prompts, filtering,
command line through OpenRLHF 0.11.2's parser) and the vLLM evaluator.

vLLM has no CPU wheel, so ``test_evaluate_checkpoint_end_to_end`` puts a stand-in ``vllm`` module in
``sys.modules``: an ``LLM`` that samples with a real tiny Qwen3 (``calibrl.sampling``) and answers in
vLLM's shapes (``RequestOutput.outputs[i].text`` / ``.token_ids``). Everything around the engine (prompt
rendering through a real chat template, chunking, grading with math-verify in worker processes, the
result layout) is the real code.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from calibrl import filtering, pipeline
from calibrl import grid as G
from calibrl.evaluate_vllm import collect_grades, evaluate_checkpoint, queue, render_prompts, summarise
from calibrl.grading import Grade
from calibrl.tasks import Scorer

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
HAVE_OPENRLHF = importlib.util.find_spec("openrlhf") is not None
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _benchmark(name: str, n: int) -> list[dict]:
    path = SHARED / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"shared data file {path} is absent")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:n]]
    return [{"id": r["id"], "problem": r["problem"], "answer": r["answer"], "source": name} for r in rows]


def _train_rows(n: int = 200) -> list[dict]:
    return [
        {"id": f"q{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i), "source": "deepscaler"}
        for i in range(n)
    ]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------- OpenRLHF runs of the paper
@pytest.mark.skipif(not HAVE_OPENRLHF, reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2)")
@pytest.mark.parametrize("method", list(PAPER["grid"]["methods"]))
def test_paper_runs_reach_openrlhfs_parser_with_rendered_prompts(method, tmp_path):
    from calibrl.train.openrlhf import command

    grid = copy.deepcopy(PAPER["grid"])
    train = _write(tmp_path / "train.jsonl", _train_rows())
    rates = {f"q{i}": (i % 9) / 8 for i in range(200)}
    (tmp_path / "success.json").write_text(json.dumps({"rates": rates}))
    data = tmp_path / "run" / "train_prompts.jsonl"
    rows = pipeline.prepare_openrlhf_data(grid, method, str(train), data, str(tmp_path / "success.json"))
    m = G.method({"grid": grid}, method)
    assert rows == (150 if m.filter_easiest else 200)
    prepared = [json.loads(line) for line in data.read_text().splitlines()]
    assert prepared[0]["prompt"] == grid["prompt_template"].format(problem=prepared[0]["problem"])
    model = grid["main_model"]
    run = pipeline.openrlhf_run(grid, model, method, 0, str(data), rows, str(tmp_path / "run"))
    ours, rest = command.split_calibrl(command.build_command(run)[3:])
    args = command.check_openrlhf_argv(rest)
    # the chat template is applied by OpenRLHF to the rendered field; no second template
    assert args.data.input_key == "prompt" and args.data.apply_chat_template and not args.data.input_template
    assert args.data.prompt_dataset == [str(data)] or args.data.prompt_dataset == str(data)
    assert float(ours["iac_alpha"]) == m.iac_alpha and float(ours["dlc_mu"]) == m.dlc_mu
    assert ours["max_steps"] == str(grid["train"]["steps"]) and args.data.max_samples <= rows


def test_filtering_drops_the_easiest_share_by_success_rate(tmp_path):
    rates = [0.5, 1.0, 0.0, 1.0, 0.25, 0.875, 0.125, 0.375]
    keep = filtering.keep_indices(rates, 0.25)
    assert keep == [0, 2, 4, 5, 6, 7]  # the two 1.0s go; ties by position
    assert filtering.keep_indices(rates, 0.0) == list(range(8))
    assert filtering.summary(rates, keep)["filter_dropped"] == 2
    with pytest.raises(ValueError, match="filter_easiest"):
        filtering.keep_indices(rates, 1.0)
    grid = copy.deepcopy(PAPER["grid"])
    train = _write(tmp_path / "train.jsonl", _train_rows(8))
    (tmp_path / "s.json").write_text(json.dumps({"rates": {f"q{i}": r for i, r in enumerate(rates)}}))
    n = pipeline.prepare_openrlhf_data(grid, "filter", str(train), tmp_path / "out.jsonl", str(tmp_path / "s.json"))
    kept = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert n == 6 and kept == [f"q{i}" for i in keep]
    (tmp_path / "s.json").write_text(json.dumps({"rates": {"q0": 1.0}}))
    with pytest.raises(ValueError, match="no success rate for 7 training ids"):
        pipeline.prepare_openrlhf_data(grid, "filter", str(train), tmp_path / "o.jsonl", str(tmp_path / "s.json"))
    with pytest.raises(ValueError, match="no success rates"):
        pipeline.prepare_openrlhf_data(grid, "filter", str(train), tmp_path / "o.jsonl")


# ------------------------------------------------------------------------------------ vLLM evaluation
def test_grades_and_metrics_of_vllm_outputs_on_real_benchmark_answers():
    records = _benchmark("math500", 4) + _benchmark("gsm8k_test", 3)
    items = queue({"math500": records[:4], "gsm8k": records[4:]}, "{problem}")
    # problem i gets i + 1 correct answers among 8 (boxed gold), the rest a wrong one; one pathological
    outputs = []
    for i, it in enumerate(items):
        right = [(f"So the answer is $\\boxed{{{it.record['answer']}}}$.", 12)] * (i + 1)
        wrong = [("The answer is \\boxed{-123456789}.", 7)] * (8 - i - 2) + [("\\boxed{" + "{" * 5000, 3)]
        outputs.append((right + wrong)[:8])
    with Scorer(workers=2) as scorer:
        grades = collect_grades(items, outputs, scorer.grades, 8)
    correct = [[g.correct for g in group] for group in grades]
    assert [sum(c) for c in correct] == [1, 2, 3, 4, 5, 6, 7]
    result = summarise(items, outputs, grades, 8, 8)
    assert set(result) == {"math500", "gsm8k"}
    assert result["math500"]["avg_at_8"] == pytest.approx((1 + 2 + 3 + 4) / 32)
    assert result["math500"]["pass_at_8"] == 1.0 and result["gsm8k"]["n_problems"] == 3
    assert result["math500"]["distinct_correct"] == 1.0 and result["math500"]["timeouts"] == 0
    with pytest.raises(ValueError, match="expected 8 samples"):
        collect_grades(items[:1], [outputs[0][:7]], scorer.grades, 8)


def test_prompts_go_through_the_chat_template():
    from calibrl.models import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = CHATML
    record = {"id": "a", "problem": "1+1", "answer": "2", "source": "x"}
    assert render_prompts([record], "Q: {problem}") == ["Q: 1+1"]
    assert render_prompts([record], "Q: {problem}", tok) == [
        "<|im_start|>user\nQ: 1+1<|im_end|>\n<|im_start|>assistant\n"
    ]
    with pytest.raises(ValueError, match="no problems"):
        queue({"empty": []}, "{problem}")


def _standin_vllm(calls: list) -> types.ModuleType:
    """A CPU stand-in for the two vllm classes the evaluator uses, sampling with a real tiny Qwen3."""
    from calibrl.models import load
    from calibrl.sampling import sample

    class SamplingParams(SimpleNamespace):
        def __init__(self, n, temperature, top_p, max_tokens):
            super().__init__(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)

    class LLM:
        def __init__(self, model, seed, **kwargs):
            self.model, self.tokenizer = load(model)
            self.generator = torch.Generator().manual_seed(seed)
            calls.append(("engine", kwargs))

        def generate(self, prompts, params, use_tqdm=True):
            calls.append(("generate", list(prompts)))
            # the stand-in's char tokenizer has no chat tokens: feed it the user text only
            plain = [p.split("user\n", 1)[-1].split("<|im_end|>", 1)[0] for p in prompts]
            roll = sample(
                self.model,
                self.tokenizer,
                plain,
                params.n,
                params.max_tokens,
                params.temperature,
                params.top_p,
                generator=self.generator,
            )
            lengths = roll.response_mask.sum(-1).tolist()
            return [
                SimpleNamespace(
                    outputs=[
                        SimpleNamespace(
                            text=roll.texts[i * params.n + j], token_ids=[0] * int(lengths[i * params.n + j])
                        )
                        for j in range(params.n)
                    ]
                )
                for i in range(len(prompts))
            ]

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, SamplingParams
    return module


def test_evaluate_checkpoint_end_to_end(tmp_path, monkeypatch):
    from calibrl.evaluate import evaluate_policy
    from calibrl.models import build_model, build_tokenizer, load, save

    tok = build_tokenizer()
    tok.chat_template = CHATML
    save(build_model(tok, hidden_size=32, num_layers=1, max_position_embeddings=512), tok, tmp_path / "ckpt")
    calls: list = []
    monkeypatch.setitem(sys.modules, "vllm", _standin_vllm(calls))
    splits = {"gsm8k": _benchmark("gsm8k_test", 3), "aime24": _benchmark("aime24", 2)}
    args = dict(n=4, k=4, temperature=1.0, top_p=1.0, max_new_tokens=6, template="{problem} Answer:")
    with Scorer(workers=1) as scorer:
        result = evaluate_checkpoint(
            str(tmp_path / "ckpt"),
            splits,
            scorer.grades,
            **args,
            chat_template=True,
            seed=0,
            tensor_parallel_size=2,
            max_prompt_len=400,
        )
        policy, tokenizer = load(tmp_path / "ckpt")
        local = evaluate_policy(policy, tokenizer, splits, scorer.grades, 4, 4, 1.0, 1.0, 6, "{problem} Answer:")
    engine = [c[1] for c in calls if c[0] == "engine"]
    assert engine == [
        {
            "tokenizer": str(tmp_path / "ckpt"),
            "tensor_parallel_size": 2,
            "max_model_len": 406,
            "dtype": "bfloat16",
            "enable_prefix_caching": True,
            "gpu_memory_utilization": 0.9,
        }
    ]
    prompts = [p for c in calls if c[0] == "generate" for p in c[1]]
    assert prompts[0].startswith("<|im_start|>user\n") and prompts[0].endswith(
        "Answer:<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(prompts) == 5
    # the same layout as the CPU evaluator's, so both flow into one aggregation
    assert result.keys() == local.keys()
    for name in splits:
        assert result[name].keys() == local[name].keys()
        assert result[name]["n_problems"] == len(splits[name]) and result[name]["n_samples"] == 4
        assert 0 <= result[name]["avg_at_4"] <= result[name]["pass_at_4"] <= 1
        assert 0 < result[name]["response_length"] <= 6


def test_grade_objects_are_what_split_metrics_reads():
    from calibrl.evaluate import split_metrics

    groups = [[Grade(True, "1"), Grade(True, "1.0"), Grade(False, None, timed_out=True), Grade(False, None)]]
    out = split_metrics(groups, [3, 4, 5, 6], 4)
    assert out == {
        "avg_at_4": 0.5,
        "pass_at_4": 1.0,
        "distinct_correct": 2.0,
        "n_problems": 1,
        "n_samples": 4,
        "timeouts": 1,
        "response_length": 4.5,
    }


def test_evaluate_job_with_the_vllm_evaluator(tmp_path, monkeypatch):
    """The evaluate rule's job at paper scale: one engine per checkpoint, the paper's template and chat
    template, results in the layout the aggregation reads."""
    from calibrl.data.records import write_jsonl
    from calibrl.models import build_model, build_tokenizer, save

    tok = build_tokenizer()
    tok.chat_template = CHATML
    save(build_model(tok, hidden_size=32, num_layers=1, max_position_embeddings=512), tok, tmp_path / "ckpt")
    calls: list = []
    monkeypatch.setitem(sys.modules, "vllm", _standin_vllm(calls))
    grid = copy.deepcopy(PAPER["grid"])
    grid["eval"].update(n=4, k=4, max_new_tokens=6, tensor_parallel_size=1)
    grid["train"]["max_prompt_len"] = 400
    splits = {}
    for name, rows in (("gsm8k", _benchmark("gsm8k_test", 2)), ("math500", _benchmark("math500", 2))):
        splits[name] = str(tmp_path / f"{name}.jsonl")
        write_jsonl(splits[name], rows)
    markers, outs = [], []
    for step in (50, 100):
        markers.append(str(tmp_path / f"step_{step}.done"))
        Path(markers[-1]).write_text(json.dumps({"step": step, "policy": str(tmp_path / "ckpt")}))
        outs.append(str(tmp_path / "eval" / f"step_{step}.json"))
    pipeline.evaluate_job(grid, markers, splits, outs, [50, 100])
    assert sum(c[0] == "engine" for c in calls) == 2
    prompts = [p for c in calls if c[0] == "generate" for p in c[1]]
    assert len(prompts) == 8 and all("within \\boxed{}.<|im_end|>" in p for p in prompts), prompts[0]
    for step, out in zip((50, 100), outs):
        result = json.loads(Path(out).read_text())
        assert result["step"] == step and set(result["splits"]) == {"gsm8k", "math500"}
        assert result["splits"]["gsm8k"]["n_samples"] == 4 and "pass_at_4" in result["splits"]["math500"]
