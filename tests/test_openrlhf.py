"""The OpenRLHF backend against OpenRLHF 0.11.2 itself: IAC in its real advantage code, every grid method's
command line through its real parser and assertions, the step limit on its real trainer classes, the
reward file, the checkpoint markers, the launcher, the SLURM/Ray script (with fake srun/ray) and the
Hugging Face DLC path on tiny Qwen3 models.

OpenRLHF's GPU-only dependencies (flash_attn, deepspeed, vllm, its Ray actor modules; ray and datasets
when they are not installed) are replaced by stubs in ``sys.modules`` for the tests that import its
trainer, and only when they cannot be imported.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import json
import os
import random
import subprocess
import sys
import threading
import types
from pathlib import Path
from types import SimpleNamespace

import openrlhf_stubs
import pytest
import torch
from conftest import filled, paper_settings

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.algo.advantages import iac
from calibrl.backends.openrlhf import command, hook, launch, loss_norm, save_cadence, steps
from calibrl.backends.openrlhf import iac as iac_patch
from calibrl.checkpoints import SETTINGS_ENV, RunStamp
from calibrl.gpu import RAY_CLUSTER, patching

HAVE_OPENRLHF = importlib.util.find_spec("openrlhf") is not None
needs_openrlhf = pytest.mark.skipif(
    not HAVE_OPENRLHF,
    reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2 peft accelerate pylatexenc)",
)
PKG = Path(command.__file__).parent
PAPER = filled("paper")  # config/paper.yaml as the workflow reads it: every run's settings come from it
RUNS = G.runs(PAPER)


def installed(target: patching.Target) -> bool:
    """Whether the package a patch target lives in is installed (this venv has OpenRLHF but not vLLM, whose stubs
    some tests put in sys.modules)."""
    try:
        importlib.metadata.distribution(target.module.split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def paper_config(**train) -> dict:
    cfg = copy.deepcopy(PAPER)
    cfg["grid"]["train"].update(train)
    return cfg


def patches_of(settings: Path) -> list[hook.Patch]:
    """The setup hook's patches for the run of ``settings`` (its settings.json), as a Ray worker reads them."""
    return hook.patches(RunStamp.read(settings))


def parsed(config: dict, run: G.Run, tmp: Path, rows: int | None = None) -> tuple[RunStamp, SimpleNamespace]:
    """(settings.json, OpenRLHF's parsed args) of ``run`` as the launcher builds and checks its command."""
    settings = paper_settings(config, run, tmp)
    stamp = RunStamp.read(settings)
    size = rows if rows is not None else (30236 if G.method(config, run.method).filters else 40315)
    argv = command.build_command(stamp, settings.parent, tmp / "prompts.jsonl", size)
    return stamp, command.check_openrlhf_argv(argv)


# ------------------------------------------------------------------------------- OpenRLHF with stubs
@pytest.fixture(scope="module")
def openrlhf_modules():
    """(experience_maker, ppo_trainer) of the installed OpenRLHF, GPU-only imports stubbed; IAC applied."""
    if not HAVE_OPENRLHF:
        pytest.skip("openrlhf is not installed")
    with openrlhf_stubs.stubbed():
        import openrlhf.trainer.ppo_trainer as ppo_trainer
        import openrlhf.trainer.ppo_utils.experience_maker as experience_maker

        cls = experience_maker.RemoteExperienceMaker
        original = cls.compute_advantages_and_returns
        compute_reward = experience_maker.compute_reward
        try:
            yield SimpleNamespace(em=experience_maker, pt=ppo_trainer, original=original, compute_reward=compute_reward)
        finally:
            cls.compute_advantages_and_returns = original
            experience_maker.compute_reward = compute_reward
            patching.remove_hooks()


@contextlib.contextmanager
def iac_at(mods, alpha: float):
    """OpenRLHF's advantage code with IAC at ``alpha`` patched in (``calibrl.backends.openrlhf.iac``), then restored."""
    iac_patch.patch(mods.em, alpha)
    try:
        yield
    finally:
        mods.em.RemoteExperienceMaker.compute_advantages_and_returns = mods.original
        mods.em.compute_reward = mods.compute_reward


def _args(estimator: str, group: int, micro: int, tmp: Path, *, use_loss=True, overlong=None) -> SimpleNamespace:
    """Real 0.11.2 args (its parser) with the experiment's estimator, group size and micro batch."""
    _, args = parsed(PAPER, G.Run("qwen3-8b", "grpo", 0), tmp)
    args.algo.advantage.estimator = estimator
    args.algo.kl.use_loss = use_loss
    args.rollout.n_samples_per_prompt = group
    args.rollout.micro_batch_size = micro
    args.rollout.max_new_tokens = 6
    args.reward.overlong_buffer_len = overlong
    return args


def _experiences(mods, args, rewards: torch.Tensor, kl_coef: float, seed: int, scores=None, responses=None):
    """A maker and the ragged, shuffled micro-batches 0.11.2 builds from per-sample rollouts (``scores``: the reward
    file's 0/1 correctness, default the rewards; ``responses``: response lengths, default random 1..6)."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    rng = random.Random(seed)
    samples = []
    scores = rewards if scores is None else scores
    responses = [None] * rewards.numel() if responses is None else responses.flatten().tolist()
    for r, score, fixed in zip(rewards.flatten().tolist(), scores.flatten().tolist(), responses):
        prompt, response = rng.randint(2, 5), rng.randint(1, 6)
        response = response if fixed is None else fixed
        length = prompt + response
        action = torch.zeros(1, length - 1, dtype=torch.long)  # over sequences[1:], 1 on the response
        action[0, prompt - 1 :] = 1
        samples.append(
            Experience(
                sequences=torch.randint(3, 50, (1, length)),
                attention_mask=torch.ones(1, length, dtype=torch.long),
                action_mask=action,
                rewards=torch.tensor([r]),
                scores=torch.tensor([score]),
                response_length=torch.tensor([response]),
                truncated=torch.tensor([False]),
                total_length=torch.tensor([float(length)]),
                prompts=["q"],
                labels=["a"],
                info={"reward": torch.tensor([r])},
            )
        )
    maker = mods.em.RemoteExperienceMaker.__new__(mods.em.RemoteExperienceMaker)
    maker.strategy, maker.args = SimpleNamespace(args=args), args
    maker.advantage_estimator = args.algo.advantage.estimator
    maker.kl_ctl = SimpleNamespace(value=kl_coef)
    maker.tokenizer = SimpleNamespace(pad_token_id=0)
    experiences = maker.split_rollout_samples(samples)
    gen = torch.Generator().manual_seed(seed)
    for e in experiences:  # what make_experience attaches (kl is 0 with --algo.kl.use_loss)
        e.kl = 0.1 * torch.rand(e.action_mask.shape, generator=gen) if kl_coef else torch.zeros(e.action_mask.shape)
    rng.shuffle(experiences)  # the advantage code must only rely on experience.index
    return maker, experiences


def _upto_eos(e) -> torch.Tensor:
    """(B, A) True at the positions whose return holds the sample's advantage (t <= last response token)."""
    eos = e.action_mask.size(1) - 1 - e.action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    return torch.arange(e.action_mask.size(1))[None, :] <= eos


def _group_advantages(experiences, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, G) advantages read off per-token advantages computed without KL or whitening, and the index."""
    index = torch.tensor([i for e in experiences for i in e.index])
    flat = torch.cat([e.advantages[:, 0] for e in experiences])
    grouped = torch.empty_like(flat)
    grouped[index] = flat
    return grouped.view(-1, group), index


REWARDS = torch.tensor(
    [[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 0, 0]], dtype=torch.float32
)


# ----------------------------------------------------------------------------------------- (a) IAC
@needs_openrlhf
@pytest.mark.parametrize("estimator", ["group_norm", "rloo", "dr_grpo", "reinforce_baseline"])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_iac_patch_calibrates_openrlhfs_group_advantages(openrlhf_modules, monkeypatch, tmp_path, estimator, alpha):
    mods = openrlhf_modules
    group = REWARDS.shape[1]
    overlong = 2.0 if estimator == "group_norm" else None  # DAPO's length shaping happens before the baseline
    args = _args(estimator, group, micro=4, tmp=tmp_path, overlong=overlong)
    maker, exps = _experiences(mods, args, REWARDS, kl_coef=0.0, seed=int(alpha * 10))

    # reference: OpenRLHF's own group advantages, without whitening (reinforce_baseline's baseline is dr_grpo's)
    plain_input = copy.deepcopy(exps)
    plain = copy.deepcopy(exps)
    reference = "dr_grpo" if estimator == "reinforce_baseline" else estimator
    ref_args = copy.deepcopy(args)
    ref_args.algo.advantage.estimator = reference
    ref_maker = copy.copy(maker)
    ref_maker.strategy, ref_maker.args = SimpleNamespace(args=ref_args), ref_args
    ref_maker.advantage_estimator = reference
    mods.original(ref_maker, plain)
    grouped, index = _group_advantages(plain, group)
    calibrated = iac(grouped, alpha, REWARDS > 0).reshape(-1)  # successes: the scores (here the 0/1 rewards)

    with iac_at(mods, alpha):
        patched = maker.compute_advantages_and_returns(exps)
    for e, p in zip(exps, plain):  # the overlong penalty is applied once, as without the patch
        assert torch.equal(e.rewards, p.rewards) and torch.equal(e.info["reward"], p.info["reward"])
    expected = [_upto_eos(e) * calibrated[torch.tensor(e.index)][:, None] for e in patched]
    if estimator == "reinforce_baseline":  # whitening over all response tokens, after IAC (L324-338)
        adv = torch.cat([x.flatten() for x in expected])
        mask = torch.cat([e.action_mask.flatten() for e in patched]).float()
        mean = (adv * mask).sum() / mask.sum()
        rstd = (((adv - mean) ** 2 * mask).sum() / mask.sum()).clamp(min=1e-8).rsqrt()
        expected = [(x - mean) * rstd for x in expected]
        # the order matters: IAC on OpenRLHF's whitened advantages would give something else
        whitened, _ = _group_advantages(mods.original(copy.copy(maker), copy.deepcopy(plain_input)), group)
        late = iac(whitened, alpha).reshape(-1)
        assert not torch.allclose(
            late,
            torch.cat([x[:, 0] for x in expected])[torch.cat([torch.tensor(e.index) for e in patched]).argsort()],
            atol=1e-3,
        )
    for e, x in zip(patched, expected):
        assert torch.allclose(e.advantages, x, atol=1e-6), (estimator, alpha)
        if estimator != "reinforce_baseline":
            assert torch.equal(e.returns, e.advantages)
    assert not torch.allclose(calibrated, grouped.reshape(-1))  # the calibration did something
    if overlong is None:  # binary rewards: the lone success of group 0 is scaled by (G - 1)^alpha
        assert calibrated[0] == pytest.approx(grouped[0, 0] * (group - 1) ** alpha)
    assert all("iac_scale" in e.info for e in patched)


@needs_openrlhf
@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_iac_patch_counts_successes_by_the_scores_under_dapos_signed_penalised_rewards(
    openrlhf_modules, tmp_path, alpha
):
    """DAPO+IAC at paper scale: the reward file's rewards are +1 / -1 and OpenRLHF adds the overlong penalty to them
    (max_new_tokens 6, buffer 2: -1 at 6 tokens); the patch counts |S+| from the 0/1 ``scores``. Group 1 (three
    correct) has its third correct answer at full length: reward 1 - 1 = 0.0, below the group's mean, still one of
    its three successes (factor 1, not the 2^alpha of two positive advantages) and its advantage not amplified."""
    mods = openrlhf_modules
    group = REWARDS.shape[1]
    args = _args("group_norm", group, micro=4, tmp=tmp_path, overlong=2.0)
    lengths = torch.ones_like(REWARDS, dtype=torch.long)
    lengths[1, 2] = 6
    maker, exps = _experiences(mods, args, 2 * REWARDS - 1, kl_coef=0.0, seed=5, scores=REWARDS, responses=lengths)
    plain = mods.original(copy.copy(maker), copy.deepcopy(exps))
    grouped, _ = _group_advantages(plain, group)
    shaped = torch.empty(REWARDS.numel())
    shaped[torch.tensor([i for e in plain for i in e.index])] = torch.cat([e.rewards for e in plain])
    assert shaped.view(-1, group)[1].tolist() == [1.0, 1.0, 0.0, -1.0]  # OpenRLHF's penalty on the signed reward
    assert grouped[1, 2] < 0
    expected = iac(grouped, alpha, REWARDS > 0)
    assert torch.equal(expected[1], grouped[1])  # (4 - 3)^alpha = 1
    assert not torch.allclose(iac(grouped, alpha)[1], grouped[1])  # the A > 0 reading: (4 - 2)^alpha
    with iac_at(mods, alpha):
        patched = maker.compute_advantages_and_returns(exps)
    got, _ = _group_advantages(patched, group)
    assert torch.allclose(got, expected, atol=1e-6)
    maker, exps = _experiences(mods, args, 2 * REWARDS - 1, kl_coef=0.0, seed=5, scores=REWARDS, responses=lengths)
    for e in exps:  # no scores: the patch refuses rather than count the shaped rewards
        e.scores = None
    with iac_at(mods, alpha), pytest.raises(RuntimeError, match="no scores"):
        maker.compute_advantages_and_returns(exps)


@needs_openrlhf
@pytest.mark.parametrize("estimator", ["group_norm", "rloo", "dr_grpo", "reinforce_baseline"])
def test_iac_alpha_zero_is_bit_identical(openrlhf_modules, tmp_path, estimator):
    """A method without IAC gets no IAC patch (``hook.patches``): OpenRLHF's own method runs, bit for bit."""
    mods = openrlhf_modules
    args = _args(estimator, REWARDS.shape[1], micro=3, tmp=tmp_path)
    maker, exps = _experiences(mods, args, REWARDS, kl_coef=0.0, seed=3)
    plain = mods.original(maker, copy.deepcopy(exps))
    for name in ("grpo", "rloo", "rpp", "drgrpo", "dapo"):
        settings = paper_settings(PAPER, G.Run("qwen3-8b", name, 0), tmp_path / name)
        assert not any(p.name.startswith("IAC") for p in patches_of(settings)), name
    assert mods.em.RemoteExperienceMaker.compute_advantages_and_returns is mods.original
    out = maker.compute_advantages_and_returns(copy.deepcopy(exps))
    for a, b in zip(out, plain):
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        iac_patch.install(0.0)


@needs_openrlhf
def test_iac_with_kl_in_the_reward(openrlhf_modules, monkeypatch, tmp_path):
    """A k1 KL in the reward (RLOO as in verl's example) stays OpenRLHF's; only the group advantage changes."""
    mods = openrlhf_modules
    group, alpha = REWARDS.shape[1], 1.0
    args = _args("rloo", group, micro=5, tmp=tmp_path, use_loss=False)
    maker, exps = _experiences(mods, args, REWARDS, kl_coef=0.05, seed=7)
    with_kl = mods.original(maker, copy.deepcopy(exps))
    no_kl_maker = copy.copy(maker)
    no_kl_maker.kl_ctl = SimpleNamespace(value=0.0)
    grouped, _ = _group_advantages(mods.original(no_kl_maker, copy.deepcopy(exps)), group)
    delta = (iac(grouped, alpha) - grouped).reshape(-1)
    with iac_at(mods, alpha):
        patched = maker.compute_advantages_and_returns(exps)
    for e, w in zip(patched, with_kl):
        expected = w.returns + _upto_eos(e) * delta[torch.tensor(e.index)][:, None]
        assert torch.allclose(e.returns, expected, atol=1e-5)


@needs_openrlhf
def test_iac_patch_is_idempotent_and_refuses_what_it_cannot_calibrate(openrlhf_modules, tmp_path):
    mods = openrlhf_modules
    cls = mods.em.RemoteExperienceMaker
    with iac_at(mods, 1.0):
        first = cls.compute_advantages_and_returns
        iac_patch.install(1.0)  # the module is imported: patched now, and not twice
        iac_patch.patch(mods.em, 1.0)
        assert cls.compute_advantages_and_returns is first
        assert first.__wrapped__ is mods.original and "iac" not in getattr(mods.original, patching.MARK, ())
        assert "iac" not in getattr(mods.em.compute_reward.__wrapped__, patching.MARK, ())  # the router wraps once
        for estimator in ("reinforce", "gae"):
            maker, exps = _experiences(mods, _args(estimator, 4, 4, tmp_path), REWARDS, 0.0, seed=1)
            with pytest.raises(ValueError, match="group estimator"):
                maker.compute_advantages_and_returns(exps)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="alpha must be > 0"):
            iac_patch.install(bad)


def test_iac_patch_fails_loudly_when_openrlhf_changes_shape():
    def module_with(method, name="fake_openrlhf_em"):
        m = types.ModuleType(name)
        m.compute_reward = lambda r, *a, **k: r
        m.RemoteExperienceMaker = type("RemoteExperienceMaker", (), {"compute_advantages_and_returns": method})
        return m

    def renamed_argument(self, batch):
        return compute_reward(batch)  # noqa: F821 - only compiled

    def no_compute_reward(self, experiences):
        return experiences

    def fine(self, experiences):
        if experiences == ["rloo"] or experiences in ["reinforce_baseline", "dr_grpo"] or experiences == "group_norm":
            return compute_reward(experiences)  # noqa: F821 - only compiled
        return experiences

    with pytest.raises(RuntimeError, match="signature"):
        iac_patch.patch(module_with(renamed_argument), 1.0)
    with pytest.raises(RuntimeError, match="compute_reward"):
        iac_patch.patch(module_with(no_compute_reward), 1.0)
    gone = "RemoteExperienceMaker.compute_advantages_and_returns is gone"
    with pytest.raises(patching.PatchTargetMissing, match=gone):
        iac_patch.patch(types.ModuleType("empty"), 1.0)
    ok = module_with(fine)
    iac_patch.patch(ok, 1.0)
    assert "iac" in getattr(ok.RemoteExperienceMaker.compute_advantages_and_returns, patching.MARK)


def test_when_imported_patches_at_import_time_once(tmp_path, monkeypatch):
    (tmp_path / "calibrl_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []

    def callback(module):
        calls.append(module.VALUE)

    try:
        patching.when_imported("calibrl_hook_probe", callback)
        patching.when_imported("calibrl_hook_probe", callback)
        assert calls == []
        import calibrl_hook_probe

        assert calls == [1] and calibrl_hook_probe.__loader__.__class__.__name__ == "SourceFileLoader"
        patching.when_imported("calibrl_hook_probe", lambda m: calls.append("now"))
        assert calls == [1, "now"]
    finally:
        sys.modules.pop("calibrl_hook_probe", None)
        patching.remove_hooks()


# --------------------------------------------------------------------------------- step limit (real)
@needs_openrlhf
def test_step_limit_on_openrlhfs_trainer_and_generator(openrlhf_modules, monkeypatch, tmp_path):
    from openrlhf.trainer.ppo_utils import samples_generator

    pt = openrlhf_modules.pt
    source = inspect.getsource(pt)
    # fit's exit contract (ppo_trainer.py L535-537), which the limit relies on
    assert "if not rollout_samples:" in source and "if is_exhausted:" in source
    base, gen_cls = pt.BasePPOTrainer, pt.SamplesGenerator
    saved = {
        (c, n): c.__dict__[n]
        for c, n in ((base, "train_step"), (base, "init_checkpoint_states"), (gen_cls, "generate_samples"))
    }
    resume = {"global_step": 0}
    try:
        base.train_step = lambda self, samples, step: ({"n": len(samples)}, step + 1)
        base.init_checkpoint_states = lambda self: dict(resume)
        steps.write_segment(tmp_path, 5)  # what the launcher records: this job stops at step 5
        steps.install(tmp_path)  # both modules are imported: patched now
        steps.install(tmp_path)  # once only
        assert base.train_step.__wrapped__.__name__ == "<lambda>"

        def run(prompts: int) -> list[int]:
            args = _args("group_norm", 2, 1, tmp_path)
            args.rollout.batch_size, args.rollout.vllm_generate_batch_size = 2, None
            args.vllm.enable_sleep = args.algo.dynamic_filtering_enable = False
            gen = gen_cls.__new__(gen_cls)
            gen.args, gen.prompts_dataloader = args, [(["d"], [f"p{i}"], ["a"], [None]) for i in range(prompts)]

            def fake_vllm(dataloader_iter, num_prompts, dynamic_filtering, **kw):
                got, _, _, exhausted = samples_generator._collect_prompt_batch(dataloader_iter, num_prompts)
                return [p for p in got for _ in range(2)], len(got), exhausted

            gen._generate_vllm = fake_vllm
            trainer = base.__new__(base)
            trainer.samples_generator = gen
            sizes, step = [], trainer.init_checkpoint_states()["global_step"]
            for _ in range(4):  # episodes, as PPOTrainer.fit (L520-573)
                while True:
                    samples, _, _, exhausted = gen.generate_samples()
                    if not samples:
                        if exhausted:
                            break
                        continue
                    status, step = trainer.train_step(samples, step)
                    sizes.append(status["n"])
                    if exhausted:
                        break
            return sizes

        assert run(prompts=5) == [4] * 5  # 2 full steps per pass (the 5th prompt is dropped), stop at 5
        assert run(prompts=100) == [4] * 5
        resume["global_step"] = 5
        assert run(prompts=100) == []  # resumed at the limit: no step 6
    finally:
        for (c, n), f in saved.items():
            setattr(c, n, f)
        patching.remove_hooks()


@needs_openrlhf
def test_every_patch_target_is_in_the_installed_openrlhf_and_a_missing_one_is_named():
    """Each patch names the 0.11.2 symbols it wraps; the launcher checks them (``hook.check``) before Ray starts."""
    from calibrl.backends.openrlhf import decay_scope, dlc

    for module in (iac_patch, steps, loss_norm, dlc, decay_scope):
        for target in module.TARGETS:
            if installed(target):  # vLLM's, where vLLM is absent: tests/test_vllm_dlc.py
                target.check()
    missing = patching.Target("openrlhf.trainer.ppo_trainer", "BasePPOTrainer.no_such_method")
    with pytest.raises(patching.PatchTargetMissing, match="BasePPOTrainer.no_such_method is not defined") as err:
        missing.check()
    assert "openrlhf==0.11.2" in str(err.value) and "installed OpenRLHF is 0.11.2" in str(err.value)
    with pytest.raises(patching.PatchTargetMissing, match="module missing"):
        patching.Target("openrlhf.no_such_module", "x").check()
    with pytest.raises(patching.PatchTargetMissing, match="no longer calls"):
        patching.Target(dlc.ENGINE, "RolloutRayActor.__init__", uses="vllm.LLM(").check()
    with pytest.raises(patching.PatchTargetMissing, match=r"takes \('model', 'weight_decay', 'no_decay_name_list'\)"):
        patching.Target(decay_scope.DEFINITION.module, decay_scope.DEFINITION.name, params=("model", "wd")).check()


LOCKS = "extension build locks a killed job left"


def test_the_setup_hook_installs_exactly_the_patches_each_paper_method_names(tmp_path):
    """One variable reaches the Ray workers, the path of the run's settings.json; the compiled method in it decides
    the patches, and IAC's alpha goes from the config to the patch through settings.json alone."""
    expected = {
        "grpo": [], "rloo": [], "rpp": [], "filter": [], "dapo": [],
        "iac": ["IAC (alpha 1)"], "iac_a0.5": ["IAC (alpha 0.5)"], "iac_a1.5": ["IAC (alpha 1.5)"],
        "iac_a2": ["IAC (alpha 2)"], "drgrpo": ["Dr. GRPO's normaliser"], "dapo_iac": ["IAC (alpha 1)"],
        "dapo_iac_dlc": ["IAC (alpha 1)", "DLC (mu 0.5)"],
    }  # fmt: skip
    for run in RUNS:
        got = [p.name for p in patches_of(paper_settings(PAPER, run, tmp_path / run.path))]
        # layouts' ds_save_steps 10 (evaluated every 50); decay scope all
        always = ["step limit", "FusedAdam on torch's kernels", LOCKS, "DeepSpeed's state every 10 steps",
                  "weight decay on every parameter"]  # fmt: skip
        assert got == [*always, *expected[run.method]], run
    scoped = paper_config(weight_decay_scope="no_bias_norm")  # OpenRLHF's own: no patch
    got = [p.name for p in patches_of(paper_settings(scoped, G.Run("qwen3-8b", "grpo", 0), tmp_path / "nb"))]
    assert got == ["step limit", "FusedAdam on torch's kernels", LOCKS, "DeepSpeed's state every 10 steps"]
    (cadence,) = [p for p in patches_of(paper_settings(PAPER, G.Run("qwen3-8b", "grpo", 0), tmp_path / "c"))
                  if p.name.startswith("DeepSpeed's")]  # fmt: skip
    assert cadence.install.func is save_cadence.install and cadence.install.args == (50,)
    _, args = parsed(PAPER, G.Run("qwen3-8b", "grpo", 0), tmp_path / "a")
    assert args.ckpt.save_steps == 10 and args.ckpt.save_hf  # the state every 10, the copies every 50 (the patch)
    cfg = copy.deepcopy(PAPER)
    cfg["grid"]["methods"]["iac"]["iac_alpha"] = 0.75
    settings = paper_settings(cfg, G.Run("qwen3-8b", "iac", 0), tmp_path / "x")
    (iac_install,) = [p.install for p in patches_of(settings) if p.name.startswith("IAC")]
    assert iac_install.func is iac_patch.install and iac_install.args == (0.75,)
    dlc_patch = [p for p in patches_of(paper_settings(PAPER, G.Run("qwen3-8b", "dapo_iac_dlc", 0), tmp_path))][-1]
    memory_dir, mu, lr, decay, layout = dlc_patch.install.args  # the memory's folder, mu, lr, decay, the layout
    assert (memory_dir, mu, lr, decay) == (str(tmp_path / "memory"), 0.5, 1e-6, (0.01, "all"))
    assert layout["colocate_all"] and layout["max_tokens_per_gpu"] == 9216  # the memory's ranks colocated
    env = launch.runtime_env(settings)
    assert env["worker_process_setup_hook"] == "calibrl.backends.openrlhf.hook.setup"
    assert env["env_vars"][SETTINGS_ENV] == str(settings.resolve())
    assert not [k for k in env["env_vars"] if k.startswith("CALIBRL_") and k != SETTINGS_ENV]


# ----------------------------------------------------------------------------- (b) command lines
@needs_openrlhf
@pytest.mark.parametrize("run", RUNS, ids=[r.path for r in RUNS])
def test_every_paper_run_parses_with_openrlhfs_parser(run, tmp_path):
    """The command of every run of config/paper.yaml, built from its settings.json, passes OpenRLHF 0.11.2's own
    parser and assertions, with the compiled method's switches as OpenRLHF's flags."""
    method = G.method(PAPER, run.method)
    stamp, args = parsed(PAPER, run, tmp_path)
    estimators = {"grpo": "group_norm", "rloo": "rloo", "rpp": "reinforce_baseline", "drgrpo": "dr_grpo"}
    assert args.algo.advantage.estimator == estimators[method.estimator]
    assert stamp.method == method  # IAC's alpha, DLC's mu: read by the setup hook
    assert stamp.settings["method"] == method.to_dict()
    assert args.actor.model_name_or_path == stamp.paths["init"]  # the downloaded folder, never a Hub id
    # batch: 64 prompts x 8 samples, then 4 optimizer steps (ppo_minibatches) of 16 prompts' 128 samples, lr 1e-6
    assert (args.rollout.batch_size, args.rollout.n_samples_per_prompt) == (64, 8)
    assert args.train.batch_size == 128 and args.train.max_epochs == 1
    assert args.actor.adam.lr == 1e-6 and args.actor.lr_scheduler == "constant"
    assert args.actor.adam.weight_decay == 0.01 and args.actor.adam.betas == [0.9, 0.999]
    # 2000 steps over every prompt: passes of rows // 64 full steps, as many as 2000 needs, and the launcher's limit
    rows = 30236 if method.filter_easiest else 40315
    assert args.data.max_samples == rows
    per_pass = rows // 64
    episodes = args.train.num_episodes // (command.DAPO_EPISODE_FACTOR if method.dapo else 1)
    assert per_pass * episodes >= 2000 > per_pass * (episodes - 1)
    # checkpoints: HF every 50 steps, resumable
    assert args.ckpt.save_steps == 10 and args.ckpt.save_hf and args.ckpt.load_enable
    assert args.ckpt.path.endswith("ckpt/openrlhf")
    assert args.reward.remote_url == [str(PKG / "reward.py")] and args.data.label_key == "answer"
    assert args.reward.clip_range[1] >= 1e5  # IAC's advantages are not cut at OpenRLHF's default 10
    if method.dapo:
        assert args.actor.eps_clip_low_high == [0.2, 0.28] and args.actor.dual_clip == 10.0
        assert args.algo.kl.init_coef == 0 and not args.algo.kl.use_loss
        assert args.algo.dynamic_filtering_enable and args.algo.dynamic_filtering_range == [0.0, 1.0]
        assert args.reward.overlong_buffer_len == 4096 and args.reward.overlong_penalty_factor == 1.0
        assert args.actor.loss_agg_mode == "token-mean"
    else:
        assert args.actor.eps_clip_low_high == [0.2, 0.2] and args.actor.dual_clip == 3.0
        assert args.algo.kl.use_loss and args.algo.kl.init_coef == 0.001 and args.algo.kl.estimator == "k3"
        assert not args.algo.dynamic_filtering_enable and args.reward.overlong_buffer_len is None
        assert args.actor.loss_agg_mode == "token-mean"  # Dr. GRPO's constant: token-mean, then loss_norm


@needs_openrlhf
def test_command_arithmetic_and_errors(tmp_path):
    # 250 rows, 20 steps of 16 prompts: 15 full steps a pass (10 prompts left over), 2 passes, every row in them
    assert command.episodes_and_samples(20, 16, 250, dapo=False) == (2, 250)
    assert command.episodes_and_samples(20, 16, 250, dapo=True) == (2 * command.DAPO_EPISODE_FACTOR, 250)
    assert command.episodes_and_samples(2000, 64, 40315, dapo=False) == (4, 40315)  # DeepScaleR: 629 steps a pass
    with pytest.raises(ValueError, match="fewer than one step's 64"):
        command.episodes_and_samples(2000, 64, 63, dapo=False)
    cfg = paper_config(steps=20, eval_every=10, prompts_per_step=16)
    _, args = parsed(cfg, G.Run("qwen3-8b", "grpo", 0), tmp_path, rows=250)
    assert (args.data.max_samples, args.train.num_episodes) == (250, 2)
    assert not args.data.apply_chat_template and args.data.input_key == "prompt"  # rendered already (data.py)
    with pytest.raises(ValueError, match="rejects"):
        command.check_openrlhf_argv(["--algo.advantage.estimator", "nope"])
    raw = copy.deepcopy(PAPER)
    raw["grid"]["methods"]["grpo"]["estimator"] = "mean"  # registered, but OpenRLHF has no such estimator
    # the config check refuses it, naming the key, before any job (the job would fail as well)
    from calibrl.config import problems

    assert ("grid.methods.grpo.estimator", "'mean' has no OpenRLHF estimator (trainer openrlhf runs "
            "['drgrpo', 'grpo', 'rloo', 'rpp'])") in problems(raw)  # fmt: skip
    settings = paper_settings(raw, G.Run("qwen3-8b", "grpo", 0), tmp_path / "m")
    with pytest.raises(ValueError, match="has no OpenRLHF estimator"):
        command.build_command(RunStamp.read(settings), tmp_path, tmp_path / "p.jsonl", 40000)


def test_over_long_prompts_are_dropped_counted_and_left_out_of_the_episode_arithmetic(tmp_path, caplog):
    """OpenRLHF 0.11.2 keeps a prompt's last --data.max_len - max_new_tokens tokens (utils/agent.py), cutting the
    chat header; the prompt file leaves out every rendered prompt of more than grid.train.max_prompt_len tokens of
    the run's tokenizer (verl drops them too), counts them in the log and beside the file, and the launcher's
    --data.max_samples and passes are the rows that remain (issue 43, N8)."""
    from calibrl.backends.openrlhf import data
    from calibrl.models import build_tokenizer

    tok = build_tokenizer()  # one token per character
    tok.chat_template = "{% for m in messages %}<|{{ m['content'] }}|>{% endfor %}"  # 4 tokens of its own
    tok.save_pretrained(tmp_path / "init")  # the run's policy folder: the job loads its tokenizer from it
    cfg = paper_config(steps=4, eval_every=2, prompts_per_step=16)
    settings = paper_settings(cfg, G.Run("qwen3-8b", "grpo", 0), tmp_path, {"init": str(tmp_path / "init")})
    stamp = json.loads(settings.read_text())
    stamp["settings"]["template"] = "{problem}"
    stamp["settings"]["train"]["max_prompt_len"] = 24
    # 100 problems of 10 to 29 characters: rendered, 14 to 33 tokens; those of 21 characters or more are over 24
    rows = [{"id": f"q{i}", "problem": str(i % 10) * (10 + i % 20), "answer": "1", "source": "x"} for i in range(100)]
    stamp["paths"]["train"] = str(tmp_path / "train.jsonl")
    Path(stamp["paths"]["train"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings.write_text(json.dumps(stamp))
    prompts = settings.parent / launch.PROMPTS
    with caplog.at_level("WARNING", logger="calibrl.openrlhf.data"):
        kept = data.prepare(stamp, prompts)  # the tokenizer from the policy folder, as in the job
    long_ids = {r["id"] for r in rows if len(r["problem"]) + 4 > 24}
    assert len(long_ids) == 45 and kept == 55
    written = [json.loads(line) for line in prompts.read_text().splitlines()]
    assert len(written) == 55 and not long_ids & {r["id"] for r in written}
    assert all(r["prompt"].startswith("<|") and len(r["prompt"]) <= 24 for r in written)  # whole, header included
    record = json.loads(data.overlong_path(prompts).read_text())
    assert record["dropped"] == 45 and record["rows"] == 55 and record["max_prompt_len"] == 24
    assert record["longest"] == 33 and set(record["dropped_ids"]) == long_ids
    assert "45 of 100 prompts have more than grid.train.max_prompt_len = 24 tokens" in caplog.text
    # the launcher counts the file's rows: OpenRLHF's prefix and passes are those of the 55 prompts left (3 steps
    # of 16 a pass: 2 passes for 4 steps)
    argv = launch.openrlhf_argv(RunStamp.read(settings))
    assert argv[argv.index("--data.max_samples") + 1] == "55" and argv[argv.index("--train.num_episodes") + 1] == "2"
    assert argv[argv.index("--data.max_len") + 1] == str(24 + cfg["grid"]["train"]["max_new_tokens"])
    # a limit every prompt fits: none dropped, the count (0) recorded all the same
    stamp["settings"]["train"]["max_prompt_len"] = 1024
    assert data.prepare(stamp, prompts) == 100 and json.loads(data.overlong_path(prompts).read_text())["dropped"] == 0


# --------------------------------------------------------------------------------------- (c) reward
def _load_reward(monkeypatch, tmp_path: Path, method: str = "grpo", workers: str | None = "0"):
    """The reward file as OpenRLHF loads it (utils/agent.py L200-205), in a rollout actor of a paper run of
    ``method``: the launcher's variables name the run's settings.json and the grading pool's size (None: unset)."""
    settings = paper_settings(PAPER, G.Run("qwen3-8b", method, 0), tmp_path / method)
    monkeypatch.setenv(SETTINGS_ENV, str(settings))
    if workers is None:
        monkeypatch.delenv("CALIBRL_REWARD_WORKERS", raising=False)
    else:
        monkeypatch.setenv("CALIBRL_REWARD_WORKERS", workers)
    spec = importlib.util.spec_from_file_location("reward_func", PKG / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROMPT = "<|im_start|>user\nWhat is 1/2 + 1/4? Put the final answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
CASES = [
    ("<think>\n1/2 = 2/4, so 3/4.\n</think>\n\nThe sum is \\boxed{\\frac{3}{4}}.<|im_end|>", "0.75", 1.0),
    ("We get $\\frac12+\\frac14=\\frac34$.\n\nThe answer is 3/4<|im_end|><|endoftext|>", "\\frac{3}{4}", 1.0),
    ("1/2 + 1/4 = 2/6, so \\boxed{\\frac{1}{3}}<|im_end|>", "\\frac{3}{4}", 0.0),
    ("I am not sure.<|im_end|>", "3/4", 0.0),
]


def test_reward_function_grades_real_responses(monkeypatch, tmp_path):
    reward = _load_reward(monkeypatch, tmp_path, "grpo", workers="0")
    assert reward.response_text(PROMPT + "x \\boxed{1}<|im_end|>", PROMPT) == "x \\boxed{1}"
    assert reward.response_text("cut prompt" + PROMPT[-20:] + "y", PROMPT[-20:]) == "y"
    results = {}

    def call(i, query, gold):  # OpenRLHF calls it in worker threads, one sample at a time
        results[i] = reward.reward_func([PROMPT + query], [PROMPT], [gold])

    threads = [threading.Thread(target=call, args=(i, q, g)) for i, (q, g, _) in enumerate(CASES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (_, _, want) in enumerate(CASES):
        out = results[i]
        assert out["rewards"].tolist() == [want] and out["scores"].tolist() == [want]
        assert set(out["extra_logs"]) == {"answer_found", "grade_timeout"}
    assert results[3]["extra_logs"]["answer_found"].tolist() == [0.0]
    batch = reward.reward_func([PROMPT + q for q, _, _ in CASES], [PROMPT] * 4, [g for _, g, _ in CASES])
    assert batch["rewards"].tolist() == [w for _, _, w in CASES]


def test_reward_function_grades_in_a_worker_pool(monkeypatch, tmp_path):
    reward = _load_reward(monkeypatch, tmp_path, "grpo", workers="1")
    assert reward.RUN.workers == 1
    try:
        out = [reward.reward_func([PROMPT + q], [PROMPT], [g])["rewards"].item() for q, g, _ in CASES[:3]]
        assert out == [1.0, 1.0, 0.0]
    finally:
        if reward.GRADER._grader is not None:
            reward.GRADER._grader.close()


@pytest.mark.parametrize("method", ["dapo", "dapo_iac", "dapo_iac_dlc", "grpo", "iac", "rloo"])
def test_reward_file_gives_dapo_runs_verls_signed_rewards_and_every_run_0_1_scores(monkeypatch, tmp_path, method):
    """The run's compiled method (settings.json) decides the reward scale: DAPO's rewards are +1 / -1 (verl's
    math_dapo.compute_score; OpenRLHF adds the overlong penalty to them), the others' 1 / 0; ``scores`` are the 0/1
    correctness in every run (the dynamic filter's range 0..1 and IAC's success count read them)."""
    reward = _load_reward(monkeypatch, tmp_path, method, workers="0")
    dapo = G.method(PAPER, method).dapo
    assert reward.RUN.reward == ("signed" if dapo else "binary")
    out = reward.reward_func([PROMPT + q for q, _, _ in CASES], [PROMPT] * 4, [g for _, g, _ in CASES])
    correct = [w for _, _, w in CASES]
    assert out["scores"].tolist() == correct == [1.0, 1.0, 0.0, 0.0]
    assert out["rewards"].tolist() == ([2 * c - 1 for c in correct] if dapo else correct)
    assert out["rewards"].dtype == out["scores"].dtype == torch.float32


def test_reward_file_refuses_to_load_without_its_run(monkeypatch, tmp_path):
    """No silent defaults: without the run's settings.json or the grading pool's size (grid.workers) the file
    fails where OpenRLHF loads it, when the rollout actor starts, naming the variable."""
    with pytest.raises(RuntimeError, match="CALIBRL_REWARD_WORKERS=None.*grid.workers"):
        _load_reward(monkeypatch, tmp_path, "grpo", workers=None)
    with pytest.raises(RuntimeError, match="CALIBRL_REWARD_WORKERS='two'"):
        _load_reward(monkeypatch, tmp_path, "grpo", workers="two")
    monkeypatch.delenv(SETTINGS_ENV)
    spec = importlib.util.spec_from_file_location("reward_func", PKG / "reward.py")
    with pytest.raises(RuntimeError, match="CALIBRL_SETTINGS is not set"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_grid_workers_reach_the_reward_files_pool_and_rerun_nothing(monkeypatch, tmp_path):
    """grid.workers -> the train rule's resources.grading_workers -> ``OpenRLHFBackend.train(..., workers)`` ->
    CALIBRL_REWARD_WORKERS in the launcher's environment -> Ray's runtime env -> the reward file's pool. It is in
    no part of settings.json (rule run_settings' params: the fingerprinted slice and the layout beside it), so a
    changed grid.workers reruns nothing."""
    from calibrl import offline
    from calibrl.backends.openrlhf import BACKEND
    from calibrl.backends.openrlhf import data as openrlhf_data

    run = G.Run("qwen3-8b", "dapo_iac", 0)
    changed = copy.deepcopy(PAPER)
    changed["grid"]["workers"] = PAPER["grid"]["workers"] + 5
    assert G.train_params(changed, run) == G.train_params(PAPER, run)
    assert G.resources(changed, run) == G.resources(PAPER, run)

    settings = paper_settings(PAPER, run, tmp_path)
    seen = {}
    monkeypatch.setattr(offline, "apply", lambda: None)
    monkeypatch.setattr(openrlhf_data, "prepare", lambda stamp, out: None)
    monkeypatch.setattr(subprocess, "run", lambda argv, check, env: seen.update(argv=argv, env=env))
    monkeypatch.delenv("CALIBRL_REWARD_WORKERS", raising=False)
    BACKEND.train(str(settings), 50, 1, 7)
    assert seen["env"]["CALIBRL_REWARD_WORKERS"] == "7" and seen["argv"][-2:] == [str(settings), "50"]
    monkeypatch.setenv("CALIBRL_REWARD_WORKERS", seen["env"]["CALIBRL_REWARD_WORKERS"])  # the launcher's process
    env = launch.runtime_env(settings)["env_vars"]
    assert env["CALIBRL_REWARD_WORKERS"] == "7" and env[SETTINGS_ENV] == str(settings.resolve())
    monkeypatch.setenv(SETTINGS_ENV, env[SETTINGS_ENV])  # a rollout actor's environment
    spec = importlib.util.spec_from_file_location("reward_func", PKG / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.RUN == module.RunReward("signed", 7, 5.0)
    from calibrl.gpu import reward as shared

    assert shared.SETTINGS_ENV is SETTINGS_ENV  # one constant names the variable (calibrl.checkpoints)


# -------------------------------------------------------------------------------------- (d) markers
def _hf_checkpoint(path: Path, complete: bool = True) -> None:
    """A Hugging Face copy as OpenRLHF's save_model writes it; incomplete: killed before ``tokenizer.json``."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    (path / "tokenizer_config.json").write_text("{}")
    if complete:
        (path / "tokenizer.json").write_text("{}")


def test_write_markers(tmp_path):
    from calibrl import checkpoints

    ckpt, markers = tmp_path / "ckpt", tmp_path / "markers"
    stamp = checkpoints.stamp({"run": "qwen3-8b/grpo/s0"}, {})
    (markers).mkdir()
    (markers / checkpoints.STAMP).write_text(json.dumps(stamp))  # the job's claim stamps the marker folder
    assert launch.write_markers(ckpt, markers, 50, 200) == []  # nothing saved yet
    _hf_checkpoint(ckpt / "global_step50_hf")
    _hf_checkpoint(ckpt / "global_step100_hf", complete=False)  # interrupted while saving
    _hf_checkpoint(ckpt / "global_step150_hf")
    _hf_checkpoint(ckpt / "global_step175_hf")  # not an evaluated step
    _hf_checkpoint(ckpt / "best_global_step50_hf")
    (ckpt / "_actor" / "global_step50").mkdir(parents=True)
    assert launch.write_markers(ckpt, markers, 50, 200) == [50, 150]
    assert sorted(p.name for p in markers.glob("*.done")) == ["step_150.done", "step_50.done"]
    marker = json.loads((markers / "step_50.done").read_text())
    policy = str((ckpt / "global_step50_hf").resolve())
    assert marker == {"step": 50, "policy": policy, "fingerprint": stamp["fingerprint"]}
    (ckpt / "global_step100_hf" / "tokenizer.json").write_text("{}")
    assert launch.write_markers(ckpt, markers, 50, 200) == [50, 100, 150]  # idempotent, picks up the rest
    with pytest.raises(ValueError):
        launch.write_markers(ckpt, markers, 0, 200)


# ------------------------------------------------------------------------------------------ launcher
@needs_openrlhf
def test_launch_main_runs_openrlhf_under_ray_with_the_setup_hook(tmp_path, monkeypatch, caplog):
    cfg = paper_config(steps=100, eval_every=50)
    settings = paper_settings(cfg, G.Run("qwen3-8b", "iac", 0), tmp_path)
    run_dir = settings.parent
    (run_dir / launch.PROMPTS).write_text("".join(json.dumps({"prompt": f"{i}+1", "answer": "1"}) + "\n"
                                                  for i in range(6400)))  # fmt: skip
    calls = {}
    fake_ray = types.ModuleType("ray")
    fake_ray.init = lambda **kw: calls.setdefault("init", kw)
    fake_ray.shutdown = lambda: calls.setdefault("shutdown", True)

    def fake_run_module(name, run_name, alter_sys):
        calls["run"] = (name, run_name, list(sys.argv))
        for step in (50, 100):
            _hf_checkpoint(run_dir / "ckpt" / "openrlhf" / f"global_step{step}_hf")

    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(launch.runpy, "run_module", fake_run_module)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    checkpoints._read_stamp.cache_clear()
    assert launch.main([str(settings), "100"]) == 0
    assert checkpoints._read_stamp.cache_info().misses == 1  # the driver parses the run's settings.json once
    env = calls["init"]["runtime_env"]
    assert calls["init"]["address"] == "10.0.0.1:6379"
    assert env["worker_process_setup_hook"] == "calibrl.backends.openrlhf.hook.setup"
    assert env["env_vars"]["CALIBRL_SETTINGS"] == str(settings.resolve())  # the one variable
    assert str(Path(launch.__file__).parents[3]) in env["env_vars"]["PYTHONPATH"].split(os.pathsep)
    assert json.loads((run_dir / steps.SEGMENT).read_text()) == {"stop_at": 100}  # for the step limit
    name, run_name, args = calls["run"]
    assert (name, run_name) == ("openrlhf.cli.train_ppo_ray", "__main__")
    assert not any(a.startswith("--calibrl") for a in args) and "--ckpt.load_enable" in args
    assert sorted(p.name for p in (run_dir / "ckpt").glob("*.done")) == ["step_100.done", "step_50.done"]
    calls.clear()
    assert launch.main([str(settings), "100"]) == 0 and "init" not in calls  # already done: a rerun trains nothing
    assert launch.main([str(settings), "50"]) == 0 and "init" not in calls  # a segment that is done
    with pytest.raises(ValueError, match="STOP_AT 75"):
        launch.main([str(settings), "75"])

    # DLC: the same one variable; the setup hook reads the memory's folder, mu and lr from settings.json
    dlc = paper_settings(cfg, G.Run("qwen3-8b", "dapo_iac_dlc", 0), tmp_path / "dlc")
    from calibrl.backends.openrlhf import dlc as dlc_patch  # vLLM's targets: checked where vLLM is (the vllm lane)

    monkeypatch.setattr(dlc_patch, "TARGETS", tuple(t for t in dlc_patch.TARGETS if installed(t)))
    (dlc.parent / launch.PROMPTS).write_text((run_dir / launch.PROMPTS).read_text())
    calls.clear()
    monkeypatch.setattr(launch.runpy, "run_module", lambda *a, **k: None)
    with caplog.at_level("ERROR", logger=launch.log.name):
        assert launch.main([str(dlc), "100"]) == 1  # the fake run saved no checkpoints
    (ended,) = [r.getMessage() for r in caplog.records if "training ended without" in r.getMessage()]
    assert "steps [50, 100]" in ended and "dynamic sampling runs out of prompts" in ended  # a DAPO run: the cause
    assert "DAPO" not in launch.ended_early(RunStamp.read(settings), [50], run_dir)  # a plain run: no such cause
    assert [k for k in calls["init"]["runtime_env"]["env_vars"] if k.startswith("CALIBRL")] == ["CALIBRL_SETTINGS"]


# ------------------------------------------------------------------------------------- ray_cluster.sh
FAKES = {
    # the allocation's nodes (inside the executor's step SLURM_JOB_NODELIST names the step's node only)
    "squeue": '#!/bin/bash\n[ "$*" = "-h -j 4242 -o %N" ] && echo "node[A-C]"\n',
    "scontrol": '#!/bin/bash\n[ "$1 $2 $3" = "show hostnames node[A-C]" ] && printf "nodeA\\nnodeB\\nnodeC\\n"\n',
    # srun: drop its options (and -w's value), run the command
    "srun": '#!/bin/bash\nwhile [[ "$1" == -* ]]; do [ "$1" = -w ] && shift; shift; done\nexec "$@"\n',
    # ray start --block: note the call, write the head's address where the real one does, block like it
    "ray": '#!/bin/bash\necho "$*" >> "$FAKE_LOG"\nfor a; do case $a in --temp-dir=*) mkdir -p "${a#*=}"\n'
    'echo -n 10.0.0.1:6379 > "${a#*=}/ray_current_cluster";; esac; done\nexec sleep 300\n',
    # python that imports ray: the number of nodes started so far; the script's node-side helpers (-c) run
    "fakepython": '#!/bin/bash\ncase $1 in -c | *.py) exec python3 "$@" ;; esac\n'
    'cat > /dev/null\ngrep -c "^start" "$FAKE_LOG"\n',
}


def test_ray_cluster_script_with_fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "nodeA",  # as in the executor's one-node step
        "FAKE_LOG": str(tmp_path / "ray.log"),
        "RAY_PYTHON": str(bin_dir / "fakepython"),
        "RAY_GPUS_PER_NODE": "2",
        "RAY_JOIN_TIMEOUT": "20",
    }
    script = RAY_CLUSTER
    proc = subprocess.run(
        ["bash", str(script), "bash", "-c", 'echo "$RAY_ADDRESS" > "$0"; exit 3', str(tmp_path / "address")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr  # the command's status
    assert (tmp_path / "address").read_text().strip().endswith(":6379")
    log = (tmp_path / "ray.log").read_text().splitlines()
    assert len(log) == 3 and log[0].startswith("start --head") and all("--num-gpus=2" in line for line in log)
    assert all(line.startswith("start --address=") and "--block" in line for line in log[1:])
    leftover = subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True, text=True).stdout.split()
    mine = [p for p in leftover if str(tmp_path) in Path(f"/proc/{p}/environ").read_bytes().decode(errors="ignore")]
    assert mine == []  # the Ray steps were stopped at exit
    bad = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert bad.returncode == 2
    # fewer CPUs than GPUs per node: OpenRLHF's bundles (a CPU per GPU) would never be placed
    few = subprocess.run(
        ["bash", str(script), "true"], env={**env, "RAY_CPUS_PER_NODE": "1"}, capture_output=True, text=True
    )
    assert few.returncode == 1 and "1 CPU(s) per node for 2 GPU(s)" in few.stderr and "cpus_per_task" in few.stderr


@needs_openrlhf
@pytest.mark.parametrize("scope", ["all", "no_bias_norm"])
def test_both_weight_decay_scopes_are_one_rule_in_openrlhf_and_the_cpu_trainers(monkeypatch, scope):
    """OpenRLHF's Adam groups (its real get_optimizer_grouped_parameters, with the decay_scope patch for scope all)
    hold the same parameters at the same decay as calibrl.optim.decay_groups, which both CPU-side trainers use."""
    from calibrl.backends.openrlhf import decay_scope
    from calibrl.models import build_model, build_tokenizer
    from calibrl.optim import decay_groups

    spec = importlib.util.spec_from_file_location("ds_utils", patching._source_file(decay_scope.DEFINITION.module))
    ds_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ds_utils)  # the file alone: its package __init__ imports the whole strategy
    strategy = types.ModuleType(decay_scope.MODULE)  # the caller's namespace: the name it looks up
    strategy.get_optimizer_grouped_parameters = ds_utils.get_optimizer_grouped_parameters
    monkeypatch.setitem(sys.modules, decay_scope.MODULE, strategy)
    if scope == "all":
        decay_scope.patch(strategy)
    model = build_model(build_tokenizer(), seed=0, num_layers=2)
    theirs = strategy.get_optimizer_grouped_parameters(model, 0.05)
    ours = decay_groups(model, 0.05, scope)

    def named(groups):
        return [({id(p) for p in g["params"]}, g["weight_decay"]) for g in groups]

    assert named(theirs) == named(ours)
    exempt = {n for n, p in model.named_parameters() if any(id(p) in ids for ids, wd in named(ours) if wd == 0)}
    norms = {n for n, _ in model.named_parameters() if "norm" in n}
    assert exempt == (norms if scope == "no_bias_norm" else set()) and len(norms) == 2 * 4 + 1


def test_dr_grpo_normaliser_inside_openrlhfs_policy_loss(openrlhf_modules, monkeypatch, tmp_path):
    """loss_agg seq-mean-token-sum-norm: the setup hook patches OpenRLHF 0.11.2's real aggregate_loss with the
    generation budget, and PolicyLoss then returns token sums / (B x L), the value calibrl.algo.losses gives on the
    same per-token losses; the KL loss and the logged entropy (openrlhf.models' re-export) keep token-mean."""
    import openrlhf.models as models
    import openrlhf.models.loss as L

    from calibrl.algo.losses import aggregate

    names = {r.method: [p.name for p in patches_of(paper_settings(PAPER, r, tmp_path / r.path))] for r in RUNS}
    assert "Dr. GRPO's normaliser" in names["drgrpo"] and "Dr. GRPO's normaliser" not in names["grpo"]
    patches = patches_of(paper_settings(PAPER, G.Run("qwen3-8b", "drgrpo", 0), tmp_path))
    drgrpo = [p for p in patches if "Dr" in p.name]
    assert drgrpo[0].install.args == (8192,)  # grid.train.max_new_tokens, read from settings.json

    original = L.aggregate_loss
    monkeypatch.setattr(L, "aggregate_loss", original)  # undone after the test
    torch.manual_seed(0)
    B, T, budget = 4, 7, 10
    mask = (torch.arange(T) < torch.tensor([7, 3, 5, 1]).unsqueeze(1)).float()
    logp, old, adv = torch.randn(B, T) * 0.1, torch.randn(B, T) * 0.1, torch.randn(B, 1).expand(B, T)
    loss_fn = L.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=3.0, token_level_loss=True)
    totals = {"dp_size": 1, "batch_num_tokens": mask.sum(), "global_batch_size": torch.tensor(float(B))}
    token_mean = loss_fn(logp, old, adv, action_mask=mask, **totals)[0]

    per_token = {}
    monkeypatch.setattr(L, "aggregate_loss", lambda loss, m, **kw: per_token.setdefault("x", loss).sum())
    loss_fn(logp, old, adv, action_mask=mask, **totals)
    monkeypatch.setattr(L, "aggregate_loss", original)
    loss_norm.install(budget)  # the setup hook: openrlhf.models is imported, so it is patched now
    normed = loss_fn(logp, old, adv, action_mask=mask, **totals)[0]
    assert torch.allclose(normed, token_mean * mask.sum() / (B * budget), atol=1e-6)
    assert torch.allclose(normed, aggregate(per_token["x"], mask, "seq-mean-token-sum-norm", budget), atol=1e-6)
    assert models.aggregate_loss is original  # what ppo_actor's KL loss and entropy use: token-mean
    # ppo_actor binds openrlhf.models' name (its KL loss, L331; its entropy, L347), not openrlhf.models.loss's
    source = patching._source_file("openrlhf.trainer.ray.ppo_actor").read_text()
    imports = [
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module == "openrlhf.models"
    ]
    assert any(a.name == "aggregate_loss" for n in imports for a in n.names)
    assert "aggregate_loss(kl, " in source and "entropy_loss = aggregate_loss(" in source
    loss_norm.install(budget)  # idempotent: wrapped once
    assert torch.allclose(loss_fn(logp, old, adv, action_mask=mask, **totals)[0], normed)
    assert L.aggregate_loss.__wrapped__ is original
    patching.remove_hooks()


def test_the_dlc_divergence_check_fails_the_run_past_its_tolerance():
    """The engines' sampling logprobs against log_softmax(f_theta - mu f_phi): within the tolerance they are logged,
    past it (or NaN) the step raises, naming the figure and the tolerance."""
    from calibrl.backends.openrlhf import dlc

    ok = {"check_mean_abs": 0.02, "check_max_abs": 0.3, "check_kl_k1": 1e-4, "check_tokens": 40}
    assert dlc.checked(ok, 1) == {f"dlc/{k}": float(v) for k, v in ok.items()}
    for bad in (0.2, float("nan")):
        with pytest.raises(dlc.DivergenceCheckFailed, match="over the tolerance 0.1"):
            dlc.checked({**ok, "check_mean_abs": bad}, 7)


def test_the_dlc_divergence_check_is_waited_for_by_name_before_the_memory_step(monkeypatch, tmp_path):
    """Rank 0 loads the rollout policy for the check while the other ranks are done with it: the memory's step (whose
    collectives would hold them under NCCL's 10-minute timeout, failing with no name) is submitted only once every
    rank has returned from the check, and a check that outruns CHECK_TIMEOUT_S fails the step naming it (issue 43,
    N10). Ray's wait and get are stand-ins here: the trainer calls nothing else of Ray for it."""
    from calibrl.backends.openrlhf import dlc

    calls, late = [], set()

    def wait(refs, num_returns, timeout):
        calls.append(("wait", tuple(refs), timeout))
        return [r for r in refs if r not in late], [r for r in refs if r in late]

    fake_ray = types.ModuleType("ray")
    fake_ray.wait = wait
    fake_ray.get = lambda refs: [{"rank": r} for r in refs]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)

    class Memory:  # MemoryGroup's calls, each returning one ref per rank
        def check(self, policy, mu, sequences, learn, logprobs):
            calls.append(("check", policy, mu, len(sequences)))
            return ["check0", "check1"]

        def step(self, sequences, learn):
            calls.append(("step", len(sequences)))
            return ["step0", "step1"]

    sample = SimpleNamespace(
        sequences=torch.tensor([[5, 6, 7]]), action_mask=torch.tensor([[1, 1]]), rollout_log_probs=torch.zeros(1, 2)
    )
    trainer = SimpleNamespace(
        _calibrl_memory=Memory(),
        samples_generator=SimpleNamespace(),
        args=SimpleNamespace(actor=SimpleNamespace(model_name_or_path="/models/init"), ckpt=SimpleNamespace(path="")),
    )
    trainer.samples_generator._calibrl_dlc_seen = [sample] * 6
    pending = dlc._memory_submit(trainer, 0, 0.5)  # step 0: the initial policy, on disk
    assert calls == [
        ("check", "/models/init", 0.5, dlc.CHECK_SEQUENCES),
        ("wait", ("check0", "check1"), dlc.CHECK_TIMEOUT_S),  # every rank, with the named bound
        ("step", 6),  # only then the memory's step
    ]
    assert pending == {"samples": 6, "check": {"rank": "check0"}, "step": ["step0", "step1"]}
    calls.clear()
    late.add("check0")  # rank 0 still loading the policy when the time is up
    monkeypatch.setattr(dlc, "CHECK_TIMEOUT_S", 5.0)
    trainer.samples_generator._calibrl_dlc_seen = [sample] * 6
    with pytest.raises(dlc.DivergenceCheckTimeout, match=r"divergence check after step 0: 1 of 2 memory ranks") as err:
        dlc._memory_submit(trainer, 0, 0.5)
    assert "within 5 s (dlc.CHECK_TIMEOUT_S)" in str(err.value) and "/models/init" in str(err.value)
    assert [c[0] for c in calls] == ["check", "wait"]  # no step submitted: no rank waits in its collectives
    # a step whose rollout policy is not on disk is not checked: the step goes straight on
    calls.clear()
    trainer.args.ckpt.path = str(tmp_path)
    trainer.samples_generator._calibrl_dlc_seen = [sample] * 6
    assert dlc._memory_submit(trainer, 3, 0.5)["check"] is None and calls == [("step", 6)]
