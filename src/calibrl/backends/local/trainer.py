"""The compact single-process RLVR trainer of the CPU backend, readable top to bottom.

One step (Algorithm 1), every formula from ``calibrl.algo`` and every switch from the run's ``MethodSpec``:
  1. take the next prompts; sample G responses each with the KV-cache sampler (from
     ``softmax(f_theta - mu f_phi)`` when DLC is on);
  2. grade them (binary verifiable reward; DAPO's is +1 / -1 with its overlong shaping, as verl's recipe);
  3. DAPO's dynamic sampling (verl's recipe) drops groups of constant accuracy, samples more prompts to refill the
     batch and trims it to ``prompts_per_step`` groups;
  4. advantages of the trained batch from the method's estimator, IAC on its group advantages (Reinforce++ then
     whitens over the batch's tokens); PPO-clip policy loss with dual clip, KL to the reference when the spec has
     one, aggregated as the spec says, AdamW with weight decay and gradient clipping in ``ppo_minibatches`` updates;
  5. DLC: the memory model takes a cross-entropy step on every sampled response;
  6. every ``eval_every`` steps: a Hugging Face checkpoint, the full trainer state (optimizers, memory, RNG, data
     cursor) for resuming, and a small marker file.
Per-step metrics go to ``ckpt/metrics.jsonl`` (``METRICS``).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from calibrl.algo import control, dapo, filtering
from calibrl.algo.advantages import advantages
from calibrl.algo.dlc import importance_weights, memory_loss
from calibrl.algo.losses import KL_ESTIMATORS, aggregate, policy_loss
from calibrl.backends.local import METRICS
from calibrl.checkpoints import write_marker
from calibrl.io import atomic_path, remove_temporaries, write_json
from calibrl.logs import Progress
from calibrl.models import load, save
from calibrl.optim import decay_groups
from calibrl.runs import checkpoint_steps
from calibrl.sampling import Rollout, position_ids_from_mask, sample
from calibrl.spec import MethodSpec, TrainSettings
from calibrl.tasks import format_prompt

log = logging.getLogger("calibrl.train")

Scorer = Callable[[Sequence[str], Sequence[dict]], list[tuple[bool, str | None]]]
"""(responses, records) -> (correct, canonical answer or None) per response."""


def token_logprobs(model, rollout: Rollout) -> torch.Tensor:
    """Log-probs (B, T) of the response tokens under ``model`` (temperature 1), one full forward pass."""
    mask = rollout.attention_mask
    out = model(input_ids=rollout.sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask))
    logits = out.logits[:, rollout.prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, rollout.responses.unsqueeze(-1)).squeeze(-1)


@dataclass
class Batch:
    """Graded rollouts of some prompts: prompt ``i``'s G responses are rows ``i*G .. i*G+G-1``."""

    rollout: Rollout
    rewards: torch.Tensor  # (B,) float, after shaping
    correct: torch.Tensor  # (B,) bool, the verifiable accuracy
    canon: list[str | None]
    prompts: list[dict]


def _pad(x: torch.Tensor, left: int, right: int, value) -> torch.Tensor:
    """(B, W) -> (B, left + W + right), filled with ``value``."""
    return torch.cat([x.new_full((x.shape[0], left), value), x, x.new_full((x.shape[0], right), value)], dim=1)


def cat_rollouts(rolls: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts of several generation batches as one: prompts re-padded on the left to the widest, responses on
    the right (positions count real tokens only, so the forward pass of each row is unchanged)."""
    if len(rolls) == 1:
        return rolls[0]
    p, t = max(r.prompt_len for r in rolls), max(r.response_mask.shape[1] for r in rolls)

    def cat(name: str, value, with_prompt: bool = False) -> torch.Tensor:
        left = [p - r.prompt_len if with_prompt else 0 for r in rolls]
        return torch.cat([_pad(getattr(r, name), n, t - r.response_mask.shape[1], value) for r, n in zip(rolls, left)])

    return Rollout(
        sequences=cat("sequences", pad_id, with_prompt=True),
        prompt_len=p,
        response_mask=cat("response_mask", False),
        logprobs=cat("logprobs", 0.0),
        entropy=cat("entropy", 0.0),
        texts=[x for r in rolls for x in r.texts],
        attention_mask=cat("attention_mask", False, with_prompt=True),
    )


def cat_batches(batches: list[Batch], pad_id: int) -> Batch:
    if len(batches) == 1:
        return batches[0]
    return Batch(
        cat_rollouts([b.rollout for b in batches], pad_id),
        torch.cat([b.rewards for b in batches]),
        torch.cat([b.correct for b in batches]),
        [c for b in batches for c in b.canon],
        [p for b in batches for p in b.prompts],
    )


def mean_entropy(batch: Batch) -> float:
    """The policy's mean per-token entropy over the responses of ``batch``."""
    mask = batch.rollout.response_mask
    return float((batch.rollout.entropy * mask).sum() / mask.sum().clamp(min=1))


class Trainer:
    """Owns the models, optimizers, data order and RNG of one run; ``run(steps)`` trains up to ``steps``."""

    def __init__(
        self,
        spec: MethodSpec,
        settings: TrainSettings,
        train_records: list[dict],
        init_dir: str | Path,
        out_dir: str | Path,
        score: Scorer,
        seed: int = 0,
        memory_dir: str | Path | None = None,
        template: str = "{problem}",
    ):
        self.spec, self.s, self.score, self.seed = spec, settings, score, seed
        self.template = template
        self.out = Path(out_dir)
        self.ckpt_dir = self.out / "ckpt"
        self.policy, self.tokenizer = load(init_dir)
        self.reference = copy.deepcopy(self.policy).eval().requires_grad_(False) if spec.uses_kl else None
        self.policy.train()
        decay = functools.partial(decay_groups, weight_decay=settings.weight_decay, scope=settings.weight_decay_scope)
        self.optimizer = torch.optim.AdamW(decay(self.policy), lr=settings.lr)
        self.memory = self.memory_opt = None
        if spec.uses_dlc:
            if memory_dir is None:
                raise ValueError(f"method {spec.name!r} uses DLC (dlc_mu {spec.dlc_mu}) and needs a memory model")
            self.memory, _ = load(memory_dir)
            self.memory_opt = torch.optim.AdamW(decay(self.memory), lr=spec.memory_lr)
        self.records = list(train_records)
        self.generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.step = 0
        self.cursor = 0  # position in the epoch-wise shuffled prompt order
        self.pool: list[int] = list(range(len(self.records)))  # indices trained on (filtering shrinks it)
        self._epoch_order: tuple[int, list[int]] = (-1, [])
        self.history: list[dict] = []  # per-step metrics, saved in every checkpoint

    # -------------------------------------------------------------------------------- data order
    def _order(self, epoch: int) -> list[int]:
        """The shuffled pool of one epoch: a function of (seed, epoch, pool) only, so resuming is exact."""
        if self._epoch_order[0] != epoch:
            order = list(self.pool)
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def _next_prompts(self, n: int) -> list[dict]:
        out = []
        while len(out) < n:
            epoch, pos = divmod(self.cursor, len(self.pool))
            out.append(self.records[self._order(epoch)[pos]])
            self.cursor += 1
        return out

    def _sample(self, prompts: list[dict], n: int, dlc: bool) -> Rollout:
        s = self.s
        return sample(
            self.policy,
            self.tokenizer,
            [format_prompt(p, self.template) for p in prompts],
            n,
            s.max_new_tokens,
            s.temperature,
            s.top_p,
            memory=self.memory if dlc else None,
            mu=self.spec.dlc_mu if dlc else 0.0,
            generator=self.generator,
        )

    # ------------------------------------------------------------------------------- filtering
    def filter_easiest(self) -> dict:
        """Table 5's filtering baseline: drop the easiest ``filter_easiest`` share of training queries, ranked by
        empirical success rate over ``filter_samples`` samples from the initial policy (Appendix I)."""
        n = self.spec.filter_samples
        rates = []
        self.policy.eval()
        progress = Progress("filtering: training queries ranked", len(self.records), log, every=10.0)
        for i in range(0, len(self.records), 64):
            chunk = self.records[i : i + 64]
            roll = self._sample(chunk, n, dlc=False)
            graded = self.score(roll.texts, [r for r in chunk for _ in range(n)])
            ok = torch.tensor([c for c, _ in graded], dtype=torch.float32).view(len(chunk), n)
            rates += ok.mean(-1).tolist()
            progress.update(len(chunk))
        self.policy.train()
        self.pool = filtering.keep_indices(rates, self.spec.filter_easiest)
        return filtering.summary(rates, self.pool)

    # -------------------------------------------------------------------------------- one step
    def _rollout(self, prompts: list[dict]) -> Batch:
        g = self.s.group_size
        self.policy.eval()
        roll = self._sample(prompts, g, dlc=self.spec.uses_dlc)
        self.policy.train()
        graded = self.score(roll.texts, [p for p in prompts for _ in range(g)])
        correct = torch.tensor([c for c, _ in graded], dtype=torch.bool)
        # 1 / 0, or DAPO's +1 / -1 with its overlong shaping (calibrl.algo.dapo, verl's recipe)
        lengths = roll.response_mask.sum(-1)
        rewards = dapo.reward(correct, lengths, self.spec.reward, self.s.max_new_tokens, self.spec.overlong_cache)
        if self.spec.shuffle_rewards:
            rewards, correct = control.shuffled(rewards, correct, self.generator)
        return Batch(roll, rewards, correct, [c for _, c in graded], prompts)

    def _dapo_keep(self, batch: Batch) -> torch.Tensor:
        """DAPO's dynamic sampling: keep the groups whose accuracy is not constant (verl's ``filter_groups.metric:
        acc``, OpenRLHF's filter on its 0/1 scores): the overlong shaping changes rewards, not the signal."""
        return dapo.informative_groups(batch.correct.view(-1, self.s.group_size).float())

    def _collect(self) -> tuple[Batch | None, list[Batch], dict]:
        """Rollouts for one step: (the batch to train on or None, every batch sampled, extra metrics).

        DAPO (verl's recipe): generation batches of ``prompts_per_step`` prompts, up to ``max_gen_batches``, until
        ``prompts_per_step`` groups are kept; the kept groups are then trimmed to exactly ``prompts_per_step``
        (verl's ``batch[:traj_bsz]``). When fewer are kept, verl raises ("Generated too many"); here the step trains
        on the groups it has, in the same ``ppo_minibatches`` updates."""
        n = self.s.prompts_per_step
        if not self.spec.dynamic_sampling:
            batch = self._rollout(self._next_prompts(n))
            return batch, [batch], {}
        sampled, kept = [], []
        while len(sampled) < self.spec.max_gen_batches and sum(len(b.prompts) for b in kept) < n:
            batch = self._rollout(self._next_prompts(n))
            sampled.append(batch)
            if (keep := self._dapo_keep(batch)).any():
                kept.append(self._select(batch, keep))
        found = sum(len(b.prompts) for b in kept)
        extra = {"dapo_groups_kept": found, "dapo_groups_sampled": n * len(sampled), "dapo_gen_batches": len(sampled)}
        if not kept:
            return None, sampled, extra
        trained = cat_batches(kept, self.tokenizer.pad_token_id)
        return self._select(trained, torch.arange(found) < n), sampled, extra

    def _select(self, batch: Batch, keep_groups: torch.Tensor) -> Batch:
        g = self.s.group_size
        rows = keep_groups.repeat_interleave(g)
        idx = rows.nonzero().squeeze(-1)
        return Batch(
            batch.rollout.rows(idx),
            batch.rewards[idx],
            batch.correct[idx],
            [batch.canon[i] for i in idx.tolist()],
            [p for p, k in zip(batch.prompts, keep_groups.tolist()) if k],
        )

    def _advantages(self, batch: Batch) -> torch.Tensor:
        """(B,) advantages of the trained batch: the estimator's group baseline, IAC (its successes the correct
        responses, not the shaped reward), then its batch transform over this batch, each response weighing its token
        count (Reinforce++ whitens over every response token of the batch, as OpenRLHF's ``reinforce_baseline``)."""
        g = self.s.group_size
        tokens = batch.rollout.response_mask.sum(-1).view(-1, g)
        rewards, correct = batch.rewards.view(-1, g), batch.correct.view(-1, g)
        return advantages(rewards, self.spec.estimator, self.spec.iac_alpha, tokens, successes=correct).view(-1)

    def _update(self, batch: Batch) -> dict:
        """PPO on ``batch`` in ``ppo_minibatches`` AdamW updates, each on whole groups in order."""
        spec, g, roll = self.spec, self.s.group_size, batch.rollout
        adv = self._advantages(batch)
        chunks = torch.arange(len(batch.prompts)).tensor_split(min(self.s.ppo_minibatches, len(batch.prompts)))
        with torch.no_grad():  # the behaviour policy's log-probs, fixed for all minibatches of this step
            old = token_logprobs(self.policy, roll)
            ref = token_logprobs(self.reference, roll) if spec.uses_kl else None
        stats = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
        for groups in chunks:
            rows = (groups[:, None] * g + torch.arange(g)).flatten()
            sub, mask = roll.rows(rows), roll.response_mask[rows]
            logp = token_logprobs(self.policy, sub)
            per_token, clipped = policy_loss(logp, old[rows], adv[rows], spec.clip_low, spec.clip_high, spec.dual_clip)
            if spec.uses_dlc:  # DLC sampled from softmax(f~), not pi_theta (calibrl.algo.dlc.IMPORTANCE)
                per_token = per_token * importance_weights(old[rows], sub.logprobs, spec.dlc_importance)
            if spec.uses_kl:
                kl = KL_ESTIMATORS[spec.kl_estimator](logp, ref[rows])
                per_token = per_token + spec.kl_coef * kl
                stats["kl"] += float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
            loss = aggregate(per_token, mask, spec.loss_agg, self.s.max_new_tokens)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.s.grad_clip)
            self.optimizer.step()
            stats["loss"] += loss.item()
            stats["grad_norm"] += float(norm)
            stats["clip_frac"] += float((clipped * mask).sum() / mask.sum().clamp(min=1))
        return {**{k: v / len(chunks) for k, v in stats.items()}, "groups_trained": len(batch.prompts),
                "updates": len(chunks)}  # fmt: skip

    def _update_memory(self, batches: list[Batch]) -> float:
        """Algorithm 1 lines 21-22: one cross-entropy step of m_phi on this step's sampled responses, the mean over
        all their tokens (as the paper-scale memory actor takes it)."""
        total = sum(int(b.rollout.response_mask.sum()) for b in batches)
        loss = 0.0
        for b in batches:
            r = b.rollout
            mask = r.attention_mask
            logits = self.memory(
                input_ids=r.sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask)
            ).logits[:, r.prompt_len - 1 : -1]
            targets = r.responses.masked_fill(~r.response_mask, -100)
            loss = loss + memory_loss(logits.float(), targets, reduction="sum") / max(total, 1)
        self.memory_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.memory_opt.step()
        return float(loss.detach())

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        trained, sampled, extra = self._collect()
        metrics = {"step": self.step + 1, **extra}
        if trained is not None:
            metrics.update(self._update(trained))
            metrics["entropy"] = mean_entropy(trained)  # of the trained groups, as verl's actor/entropy
        else:  # DAPO found no informative group: nothing for the policy to learn from this step
            metrics.update(loss=0.0, kl=0.0, clip_frac=0.0, grad_norm=0.0, groups_trained=0, updates=0)
        if self.memory is not None and sampled:  # m_phi learns what was sampled, kept or not (Algorithm 1 l. 22)
            metrics["memory_loss"] = self._update_memory(sampled)
        metrics.update(self._rollout_metrics(sampled))  # over every sampled group, as for the other methods
        metrics["seconds"] = time.perf_counter() - t0
        metrics["time"] = time.time()  # wall clock at the step's end: the MLflow run's real start and end
        self.step += 1
        return metrics

    def _rollout_metrics(self, batches: list[Batch]) -> dict:
        if not batches:
            return {}
        g = self.s.group_size
        lengths = torch.cat([b.rollout.response_mask.sum(-1).float() for b in batches])
        correct = torch.cat([b.correct for b in batches]).float()
        distinct = []
        for b in batches:
            for i in range(len(b.prompts)):
                answers = {c for c in b.canon[i * g : (i + 1) * g] if c is not None}
                distinct.append(len(answers))
        return {
            "reward": float(torch.cat([b.rewards for b in batches]).mean()),
            "accuracy": float(correct.mean()),
            "response_length": float(lengths.mean()),
            "distinct_correct": sum(distinct) / max(len(distinct), 1),
        }

    # ------------------------------------------------------------------------ checkpoints/resume
    def save_checkpoint(self) -> Path:
        """HF weights (+ memory) and the trainer state under ``ckpt/step_k``, then the marker ``step_k.done``."""
        step_dir = self.ckpt_dir / f"step_{self.step}"
        save(self.policy, self.tokenizer, step_dir / "policy")
        if self.memory is not None:
            save(self.memory, self.tokenizer, step_dir / "memory")
        state = {
            "step": self.step,
            "cursor": self.cursor,
            "pool": self.pool,
            "optimizer": self.optimizer.state_dict(),
            "memory_opt": self.memory_opt.state_dict() if self.memory_opt else None,
            "history": self.history,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        with atomic_path(step_dir / "trainer_state.pt") as tmp:
            torch.save(state, tmp)
        write_marker(self.ckpt_dir / f"step_{self.step}.done", self.step, step_dir / "policy")
        return step_dir

    def latest_checkpoint(self) -> int | None:
        steps = [
            int(p.name.split("_")[1])
            for p in self.ckpt_dir.glob("step_*")
            if p.is_dir() and (p / "trainer_state.pt").exists() and (p / "policy").exists()
        ]
        return max(steps) if steps else None

    def resume(self, step: int) -> None:
        step_dir = self.ckpt_dir / f"step_{step}"
        policy, _ = load(step_dir / "policy")
        self.policy.load_state_dict(policy.state_dict())
        self.policy.train()
        if self.memory is not None:
            memory, _ = load(step_dir / "memory")
            self.memory.load_state_dict(memory.state_dict())
        state = torch.load(step_dir / "trainer_state.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.memory_opt is not None:
            self.memory_opt.load_state_dict(state["memory_opt"])
        self.step, self.cursor, self.pool = state["step"], state["cursor"], state["pool"]
        self.history = list(state["history"])
        self._epoch_order = (-1, [])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])

    # ------------------------------------------------------------------------------------- run
    def run(self) -> None:
        """Train up to ``settings.steps``, resuming from the last checkpoint of the run folder."""
        self.out.mkdir(parents=True, exist_ok=True)
        if removed := remove_temporaries(self.out):
            log.info("removed %d temporaries that killed writes of an earlier attempt left", removed)
        metrics_path = self.out / METRICS
        start = self.latest_checkpoint()
        if start is not None:
            self.resume(start)
            log.info("resumed from checkpoint step %d", start)
            for done in checkpoint_steps(self.s.eval_every, start):  # Snakemake may have removed them
                write_marker(self.ckpt_dir / f"step_{done}.done", done, self.ckpt_dir / f"step_{done}" / "policy")
        # The log is rebuilt from the checkpoint's own record: a rerun never duplicates lines.
        with atomic_path(metrics_path) as tmp:
            tmp.write_text("".join(json.dumps(m) + "\n" for m in self.history))
        if start is None and self.spec.filters:
            info = self.filter_easiest()
            log.info("filtering baseline: %s", info)
            write_json(self.out / "filter.json", info)
        progress = Progress("train steps", self.s.steps, log, every=10.0, done=self.step)
        with open(metrics_path, "a", encoding="utf-8") as fh:
            while self.step < self.s.steps:
                metrics = self.train_step()
                self.history.append(metrics)
                fh.write(json.dumps(metrics) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
                progress.update(
                    note=f"reward={metrics.get('reward', float('nan')):.3f} "
                    f"entropy={metrics.get('entropy', float('nan')):.3f}"
                )
                if self.step % self.s.eval_every == 0:
                    self.save_checkpoint()
