"""Evaluate one checkpoint at paper scale: every benchmark in one vLLM engine, graded by math-verify.

The result has the layout of ``calibrl.evaluate.evaluate_policy`` (per split: avg_at_k, pass_at_k,
distinct_correct, n_problems, n_samples, timeouts, response_length), so both flow into the same
aggregation. Prompts are the training prompts: the config's template around the problem, wrapped in the
model's chat template when ``chat_template`` is set, exactly as OpenRLHF renders them for training
(``apply_chat_template(..., add_generation_prompt=True)``, Qwen3's thinking mode left at its default).

Generation runs chunk by chunk (``chunk_prompts`` problems, all splits in one queue) so the log shows
progress with an ETA; grading a chunk in the process pool overlaps generating the next one. vLLM is
imported only inside ``generate_and_grade``: it has no CPU wheel, and everything else here is tested on
CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from calibrl.evaluate import split_metrics
from calibrl.logs import Progress
from calibrl.tasks import format_prompt

log = logging.getLogger("calibrl.evaluate_vllm")


@dataclass(frozen=True)
class Item:
    """One problem of one split, in the engine's queue."""

    split: str
    record: dict
    prompt: str


def render_prompts(records: Sequence[dict], template: str, tokenizer=None) -> list[str]:
    """The model's input text per record: the template, then the chat template when a tokenizer is given."""
    texts = [format_prompt(r, template) for r in records]
    if tokenizer is None:
        return texts
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]


def queue(splits: dict[str, list[dict]], template: str, tokenizer=None) -> list[Item]:
    """Every problem of every split, in split order."""
    items = []
    for name, records in splits.items():
        if not records:
            raise ValueError(f"evaluation split {name!r} has no problems")
        items += [Item(name, r, p) for r, p in zip(records, render_prompts(records, template, tokenizer))]
    return items


def engine_kwargs(policy_dir: str, seed: int, tensor_parallel_size: int, max_model_len: int) -> dict:
    """``vllm.LLM`` arguments. bf16 as in training; prefix caching shares the prompt's KV across its n samples."""
    return {
        "model": str(policy_dir),
        "tokenizer": str(policy_dir),
        "seed": int(seed),
        "tensor_parallel_size": int(tensor_parallel_size),
        "max_model_len": int(max_model_len),
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.9,
    }


def sampling_kwargs(n: int, temperature: float, top_p: float, max_new_tokens: int) -> dict:
    """``vllm.SamplingParams`` arguments: n samples per problem, the config's temperature and top-p.

    No per-request seed: the engine's seed fixes the run (a per-request seed with n > 1 is handled
    differently across vLLM versions)."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}")
    return {"n": int(n), "temperature": float(temperature), "top_p": float(top_p), "max_tokens": int(max_new_tokens)}


def collect_grades(items: Sequence[Item], outputs: Sequence[Sequence[tuple[str, int]]], grade: Callable, n: int):
    """The grades of one chunk, n per item, from one call to the grader (so its pool sees the whole chunk)."""
    for item, outs in zip(items, outputs, strict=True):
        if len(outs) != n:
            raise ValueError(f"{item.split}: expected {n} samples per problem, got {len(outs)}")
    flat = grade([t for outs in outputs for t, _ in outs], [it.record for it in items for _ in range(n)])
    return [flat[i * n : (i + 1) * n] for i in range(len(items))]


def summarise(
    items: Sequence[Item], outputs: Sequence[Sequence[tuple[str, int]]], grades: Sequence[Sequence], n: int, k: int
) -> dict:
    """Per split: AVG@k, PASS@k and the rest of ``split_metrics``, from each item's n outputs and grades."""
    per_split: dict[str, dict] = {}
    for item, outs, group in zip(items, outputs, grades, strict=True):
        acc = per_split.setdefault(item.split, {"grades": [], "lengths": []})
        acc["grades"].append(list(group))
        acc["lengths"] += [length for _, length in outs]
    return {name: split_metrics(acc["grades"], acc["lengths"], k) for name, acc in per_split.items()}


def generate_and_grade(
    policy_dir: str,
    items: Sequence[Item],
    grade: Callable,
    sampling: dict,
    seed: int,
    tensor_parallel_size: int = 1,
    max_model_len: int = 10240,
    chunk_prompts: int = 512,
    what: str = "prompts",
) -> tuple[list[list[tuple[str, int]]], list[list]]:
    """n samples per item from one vLLM engine (``sampling``: ``sampling_kwargs``), and their grades."""
    import vllm

    params = vllm.SamplingParams(**sampling)
    llm = vllm.LLM(**engine_kwargs(policy_dir, seed, tensor_parallel_size, max_model_len))
    progress = Progress(f"{what} generated", len(items), log, every=30.0)
    graded = Progress(f"{what} graded", len(items), log, every=30.0)  # updated by the grading thread only

    def grade_chunk(chunk: Sequence[Item], outs: list[list[tuple[str, int]]]) -> list[list]:
        result = collect_grades(chunk, outs, grade, sampling["n"])
        graded.update(len(chunk))
        return result

    outputs: list[list[tuple[str, int]]] = []
    pending = []
    with ThreadPoolExecutor(1) as grading:  # grade chunk i while the GPU generates chunk i + 1
        for start in range(0, len(items), chunk_prompts):
            chunk = items[start : start + chunk_prompts]
            results = llm.generate([it.prompt for it in chunk], params, use_tqdm=False)
            outs = [[(o.text, len(o.token_ids)) for o in req.outputs] for req in results]
            outputs += outs
            pending.append(grading.submit(grade_chunk, chunk, outs))
            progress.update(len(chunk), note=chunk[-1].split)
        grades = [g for fut in pending for g in fut.result()]
    return outputs, grades


def tokenizer_for(policy_dir: str, chat_template: bool):
    """The checkpoint's tokenizer when prompts go through its chat template, else None."""
    if not chat_template:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_dir)


def evaluate_checkpoint(
    policy_dir: str,
    splits: dict[str, list[dict]],
    grade: Callable,
    n: int,
    k: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    template: str,
    chat_template: bool,
    seed: int,
    tensor_parallel_size: int = 1,
    max_prompt_len: int = 2048,
) -> dict:
    """All splits of one checkpoint in one vLLM engine; ``grade(responses, records) -> list[Grade]``."""
    items = queue(splits, template, tokenizer_for(policy_dir, chat_template))
    outputs, grades = generate_and_grade(
        policy_dir,
        items,
        grade,
        sampling_kwargs(n, temperature, top_p, max_new_tokens),
        seed,
        tensor_parallel_size,
        max_prompt_len + max_new_tokens,
        what="evaluation prompts",
    )
    return summarise(items, outputs, grades, n, k)
