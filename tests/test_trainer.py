"""The CPU backend's trainer on a micro setting: real tiny Qwen3 models, real math-verify grading."""

import json

import pytest
import torch

from calibrl import config as C
from calibrl.algo.advantages import ESTIMATORS, whiten
from calibrl.backends.local.trainer import Trainer, cat_rollouts, mean_entropy, token_logprobs
from calibrl.data import countdown
from calibrl.models import build_model, build_tokenizer, load, save
from calibrl.spec import TrainSettings, compile_method
from calibrl.tasks import Scorer

TRAIN = C.filled(
    "grid.train",
    {"steps": 4, "eval_every": 2, "prompts_per_step": 4, "group_size": 4, "lr": 3e-3, "memory_lr": 1e-3,
     "max_new_tokens": 6, "ppo_minibatches": 2, "dapo_overlong_cache": 4},
)  # fmt: skip
SETTINGS = TrainSettings.from_config(TRAIN)
ARCH = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def Method(estimator="grpo", **switches):
    """A method compiled with the micro training settings (``calibrl.spec.compile_method``)."""
    return compile_method("m", C.filled("grid.methods.*", {"estimator": estimator, **switches}), TRAIN)


@pytest.fixture(scope="module")
def scorer():
    with Scorer(workers=1) as s:
        yield s


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("init") / "policy"
    tok = build_tokenizer()
    save(build_model(tok, seed=0, **ARCH), tok, path)
    return path


@pytest.fixture(scope="module")
def records():
    return countdown.generate("train", 32, seed=0)


def make(method, init_dir, records, scorer, out, settings=SETTINGS, memory=None):
    torch.manual_seed(0)
    return Trainer(method, settings, records, init_dir, out, scorer, seed=0, memory_dir=memory, template="{problem}:")


def test_iac_changes_exactly_the_positive_advantages(init_dir, records, scorer, tmp_path):
    # Rewards of a freshly initialised model are nearly all 0, so inject rewards through the scorer.
    def fake_rewards(texts, recs):
        return [(i % 3 == 0, None) for i in range(len(texts))]

    base = make(Method("grpo"), init_dir, records, fake_rewards, tmp_path / "a")
    calib = make(Method("grpo", iac_alpha=1.0), init_dir, records, fake_rewards, tmp_path / "b")
    prompts = records[:4]
    b1, b2 = base._rollout(prompts), calib._rollout(prompts)
    assert torch.equal(b1.rollout.sequences, b2.rollout.sequences)  # same seed, same samples
    a, c = base._advantages(b1).view(-1, 4), calib._advantages(b2).view(-1, 4)
    n_pos = (a > 0).sum(-1, keepdim=True)
    assert torch.allclose(torch.where(a > 0, a * (4 - n_pos), a), c)
    assert torch.equal(a[a <= 0], c[a <= 0])


def test_dapo_trains_on_verls_signed_reward_with_the_overlong_penalty(init_dir, records, tmp_path):
    """DAPO's reward in the CPU trainer is verl's: +1 correct / -1 wrong, plus the penalty from max_new_tokens -
    dapo_overlong_cache (6 - 4 = 2 tokens) linearly down to -1 at 6 tokens; the other methods' is 1 / 0, unshaped.
    The dynamic filter still reads the correctness."""

    def score(texts, recs):
        return [(i % 3 == 0, None) for i in range(len(texts))]

    dapo_trainer = make(Method("grpo", dapo=True), init_dir, records, score, tmp_path / "dapo")
    grpo_trainer = make(Method("grpo"), init_dir, records, score, tmp_path / "grpo")
    assert dapo_trainer.spec.reward == "signed" and grpo_trainer.spec.reward == "binary"
    shaped, plain = dapo_trainer._rollout(records[:4]), grpo_trainer._rollout(records[:4])
    assert torch.equal(shaped.rollout.sequences, plain.rollout.sequences)  # same seed, same samples
    lengths = shaped.rollout.response_mask.sum(-1).float()
    correct = torch.tensor([i % 3 == 0 for i in range(16)])
    assert torch.equal(shaped.correct, correct) and torch.equal(plain.correct, correct)
    penalty = ((2 - lengths) / 4).clamp(-1.0, 0.0)  # verl: min(-(L - (6 - 4)) / 4 * 1.0, 0)
    assert torch.allclose(shaped.rewards, torch.where(correct, 1.0, -1.0) + penalty)
    assert (penalty < 0).any()  # the shaping acted on these samples
    assert torch.equal(plain.rewards, correct.float())
    assert float(shaped.rewards[correct].min()) > float(shaped.rewards[~correct].max())


def test_iac_in_the_trainer_counts_correct_responses_not_shaped_rewards(init_dir, records, tmp_path):
    """DAPO+IAC: a correct response that the overlong penalty put below its group's mean is a success in |S+|
    (and keeps its negative advantage); the count is not read off the shaped reward."""
    alpha = 2.0
    trainer = make(Method("grpo", dapo=True, iac_alpha=alpha), init_dir, records, lambda t, r: [(False, None)] * len(t),
                   tmp_path)  # fmt: skip
    batch = trainer._rollout(records[:4])
    batch.correct = torch.tensor([1, 1, 1, 0] + [1, 0, 0, 0] * 3, dtype=torch.bool)
    # group 0: the third correct answer at full length (1 - 1 = 0.0), below the group's mean 0.25
    batch.rewards = torch.tensor([1.0, 1.0, 0.0, -1.0] + [1.0, -1.0, -1.0, -1.0] * 3)
    got = trainer._advantages(batch).view(-1, 4)
    a = ESTIMATORS["grpo"].group(batch.rewards.view(-1, 4))
    assert a[0, 2] < 0
    assert torch.equal(got[0], a[0])  # three successes: (4 - 3)^2 = 1; read off A > 0 it would be (4 - 2)^2 = 4
    assert torch.allclose(got[1:, 0], a[1:, 0] * 9) and torch.equal(got[1:, 1:], a[1:, 1:])  # one success: 3^2


def test_the_control_arm_trains_on_the_steps_rewards_permuted_across_its_responses(init_dir, records, tmp_path):
    """shuffle_rewards: the same samples as GRPO's at the same seed, the same multiset of (reward, correct) pairs,
    each pair moved to another response by one permutation (calibrl.algo.control); GRPO's stay in place."""

    def score(texts, recs):
        return [(i % 3 == 0, None) for i in range(len(texts))]

    control = make(Method("grpo", shuffle_rewards=True), init_dir, records, score, tmp_path / "control")
    grpo = make(Method("grpo"), init_dir, records, score, tmp_path / "grpo")
    shuffled, plain = control._rollout(records[:4]), grpo._rollout(records[:4])
    assert torch.equal(shuffled.rollout.sequences, plain.rollout.sequences)  # same seed, same samples
    assert torch.equal(plain.correct, torch.tensor([i % 3 == 0 for i in range(16)]))
    assert not torch.equal(shuffled.correct, plain.correct)  # moved (a fixed seed: not by chance equal)
    assert sorted(zip(shuffled.rewards.tolist(), shuffled.correct.tolist())) == sorted(
        zip(plain.rewards.tolist(), plain.correct.tolist())
    )
    assert torch.equal(shuffled.rewards, shuffled.correct.float())  # each reward still with its own correctness


def test_dapo_filter_drops_groups_of_constant_accuracy(init_dir, records, scorer, tmp_path):
    """verl's filter_groups.metric acc: the filter reads correctness; the overlong shaping changes rewards only."""
    trainer = make(Method("grpo", dapo=True), init_dir, records, scorer, tmp_path)
    batch = trainer._rollout(records[:4])
    batch.correct = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    # group 3: all correct, one response overlong: its shaped rewards differ, its accuracy does not
    batch.rewards = batch.correct.float() - torch.tensor([0.0] * 15 + [0.5])
    assert trainer._dapo_keep(batch).tolist() == [False, False, True, False]
    kept = trainer._select(batch, trainer._dapo_keep(batch))
    assert len(kept.prompts) == 1 and kept.rollout.sequences.shape[0] == 4


def _spy(trainer, informative: int):
    """Record every generation batch and the batch trained on, count AdamW updates; the groups from
    ``informative`` on get an entropy of 50 nats a token, so that an average over them shows."""
    seen = {"sampled": [], "trained": [], "updates": 0}
    rollout, update, step = trainer._rollout, trainer._update, trainer.optimizer.step

    def spy_rollout(prompts):
        batch = rollout(prompts)
        batch.rollout.entropy[4 * informative :] = 50.0
        seen["sampled"].append(batch)
        return batch

    def spy_update(batch):
        seen["trained"].append(batch)
        return update(batch)

    def spy_step(*a, **k):
        seen["updates"] += 1
        return step(*a, **k)

    trainer._rollout, trainer._update, trainer.optimizer.step = spy_rollout, spy_update, spy_step
    return seen


@pytest.mark.parametrize("informative, batches, trained", [(3, 2, 4), (1, 3, 3)])
def test_dapo_step_trains_prompts_per_step_groups_in_ppo_minibatches_updates(
    init_dir, records, tmp_path, informative, batches, trained
):
    """verl's DAPO recipe: generation batches until prompts_per_step (4) groups are kept, trimmed to exactly that
    many, then ppo_minibatches (2) updates. With 3 informative groups per batch: 6 found, 4 trained (3 + 1); with 1
    per batch after dapo_max_gen_batches (3): the 3 found, still in 2 updates."""

    def score(texts, recs):  # groups 0..informative-1 of every batch have one success, the others none
        return [(i % 4 == 0 and i // 4 < informative, None) for i in range(len(texts))]

    trainer = make(Method("grpo", dapo=True), init_dir, records, score, tmp_path)
    seen = _spy(trainer, informative)
    metrics = trainer.train_step()
    assert len(seen["sampled"]) == metrics["dapo_gen_batches"] == batches
    assert metrics["dapo_groups_kept"] == informative * batches and metrics["dapo_groups_sampled"] == 4 * batches
    (batch,) = seen["trained"]
    expected = [p for b in seen["sampled"] for p in b.prompts[:informative]][:4]
    assert batch.prompts == expected and batch.rollout.sequences.shape[0] == 4 * trained
    assert metrics["groups_trained"] == trained and metrics["updates"] == seen["updates"] == SETTINGS.ppo_minibatches
    # the entropy is the trained groups' (a fresh model's, about log of the vocabulary), not every sampled group's
    assert metrics["entropy"] == pytest.approx(mean_entropy(batch)) and metrics["entropy"] < 10


def test_rollouts_of_several_generation_batches_concatenate_without_changing_a_row(init_dir, records, tmp_path):
    trainer = make(Method("grpo"), init_dir, records, lambda t, r: [(False, None)] * len(t), tmp_path)
    short = min(records, key=lambda r: len(r["problem"]))
    long = max(records, key=lambda r: len(r["problem"]))
    a, b = trainer._rollout([short]).rollout, trainer._rollout([long, short]).rollout
    assert a.prompt_len != b.prompt_len
    both = cat_rollouts([a, b], trainer.tokenizer.pad_token_id)
    assert both.sequences.shape[0] == 12 and both.texts == a.texts + b.texts
    with torch.no_grad():
        together = token_logprobs(trainer.policy, both)
        for rows, r in ((slice(0, 4), a), (slice(4, 12), b)):
            width = r.response_mask.shape[1]
            assert torch.equal(both.response_mask[rows, :width], r.response_mask)
            assert not both.response_mask[rows, width:].any()
            alone = token_logprobs(trainer.policy, r)
            assert torch.allclose(together[rows, :width] * r.response_mask, alone * r.response_mask, atol=1e-5)


def test_reinforce_pp_whitens_over_the_tokens_of_the_trained_batch(init_dir, records, tmp_path):
    """OpenRLHF 0.11.2's reinforce_baseline: group mean, then whitening over every response token of the batch."""
    trainer = make(Method("rpp"), init_dir, records, lambda t, r: [(i % 3 == 0, None) for i in range(len(t))],
                   tmp_path)  # fmt: skip
    for start in range(0, len(records), 4):  # a batch whose responses differ in length: else tokens and responses
        batch = trainer._rollout(records[start : start + 4])  # would weigh alike
        lengths = batch.rollout.response_mask.sum(-1)
        if len(set(lengths.tolist())) > 1:
            break
    assert len(set(lengths.tolist())) > 1
    r = batch.rewards.view(4, 4)
    tokens = torch.repeat_interleave((r - r.mean(-1, keepdim=True)).flatten(), lengths)  # one value per token
    expected = ((r - r.mean(-1, keepdim=True)).flatten() - tokens.mean()) / tokens.std(correction=0)
    assert torch.allclose(trainer._advantages(batch), expected, atol=1e-6)
    assert not torch.allclose(trainer._advantages(batch), whiten(r - r.mean(-1, keepdim=True)).flatten())


def test_loss_decreases_on_a_fixed_batch(init_dir, records, scorer, tmp_path):
    trainer = make(
        Method("grpo"), init_dir, records, lambda t, r: [(i % 2 == 0, None) for i in range(len(t))], tmp_path
    )
    batch = trainer._rollout(records[:4])
    losses = [trainer._update(batch)["loss"] for _ in range(8)]
    assert losses[-1] < losses[0]


def test_checkpoints_markers_and_exact_resume(init_dir, records, scorer, tmp_path):
    full = make(Method("grpo", iac_alpha=1.0), init_dir, records, scorer, tmp_path / "full")
    full.run()
    lines = (tmp_path / "full" / "ckpt" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]
    for step in (2, 4):
        marker = json.loads((tmp_path / "full" / "ckpt" / f"step_{step}.done").read_text())
        model, tok = load(marker["policy"])  # a Hugging Face checkpoint, loaded through the Auto classes
        assert type(model).__name__ == "Qwen3ForCausalLM"

    half = SETTINGS.__class__(**{**SETTINGS.__dict__, "steps": 2})
    make(Method("grpo", iac_alpha=1.0), init_dir, records, scorer, tmp_path / "cut", settings=half).run()
    resumed = make(Method("grpo", iac_alpha=1.0), init_dir, records, scorer, tmp_path / "cut")
    resumed.run()  # picks up step_2 and trains steps 3 and 4
    for p, q in zip(full.policy.state_dict().values(), resumed.policy.state_dict().values()):
        assert torch.equal(p, q)
    cut = (tmp_path / "cut" / "ckpt" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in cut] == [1, 2, 3, 4]
    # A rerun rebuilds the step log and the markers from the checkpoint (here both deleted).
    (tmp_path / "cut" / "ckpt" / "metrics.jsonl").unlink()
    (tmp_path / "cut" / "ckpt" / "step_2.done").unlink()
    make(Method("grpo", iac_alpha=1.0), init_dir, records, scorer, tmp_path / "cut").run()
    assert (tmp_path / "cut" / "ckpt" / "metrics.jsonl").read_text().splitlines() == cut
    assert (tmp_path / "cut" / "ckpt" / "step_2.done").exists()


def test_dlc_run_trains_the_memory(init_dir, records, scorer, tmp_path):
    mem_dir = tmp_path / "memory"
    tok = build_tokenizer()
    save(build_model(tok, seed=1, **ARCH), tok, mem_dir)
    trainer = make(Method("grpo", dlc_mu=0.5), init_dir, records, scorer, tmp_path / "run", memory=mem_dir)
    before = [p.clone() for p in trainer.memory.parameters()]
    metrics = trainer.train_step()
    assert "memory_loss" in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.memory.parameters()))


def test_dlc_memory_learns_every_sampled_group_even_when_dapo_keeps_none(init_dir, records, tmp_path):
    """Algorithm 1 line 22: m_phi takes its step on what was sampled, including the groups DAPO drops; a step
    whose groups are all dropped leaves the policy alone but still trains the memory."""
    mem_dir = tmp_path / "memory"
    tok = build_tokenizer()
    save(build_model(tok, seed=1, **ARCH), tok, mem_dir)
    trainer = make(Method("grpo", dapo=True, dlc_mu=0.5), init_dir, records, lambda t, r: [(False, None)] * len(t),
                   tmp_path / "run", memory=mem_dir)  # fmt: skip
    trainer._dapo_keep = lambda batch: torch.zeros(len(batch.prompts), dtype=torch.bool)  # every group dropped
    policy, memory = [p.clone() for p in trainer.policy.parameters()], [p.clone() for p in trainer.memory.parameters()]
    metrics = trainer.train_step()
    assert metrics["dapo_groups_kept"] == 0 and metrics["dapo_groups_sampled"] > 0
    assert metrics["memory_loss"] > 0
    assert all(torch.equal(a, b) for a, b in zip(policy, trainer.policy.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(memory, trainer.memory.parameters()))
