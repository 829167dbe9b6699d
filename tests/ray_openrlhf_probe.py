"""Test-only Ray actors for tests/test_ray_openrlhf.py (imported after ``ray_openrlhf_hook.stub_gpu_only``).

``Probe`` subclasses OpenRLHF 0.11.2's trainer base, as ``PPOTrainer`` does, and runs OpenRLHF's own experience
maker on made-up rollouts inside a Ray worker whose patches came from the launcher's runtime environment.
``RewardHost`` is an async actor holding OpenRLHF's ``SingleTurnAgentExecutor``, which loads and calls the
reward file as the vLLM rollout actors do.
"""

from __future__ import annotations

import asyncio
import os
import random
from types import SimpleNamespace

import torch
from openrlhf.trainer.ppo_trainer import BasePPOTrainer


class Probe(BasePPOTrainer):
    """A trainer actor without models or engines (``BasePPOTrainer.__init__`` wants both)."""

    def __init__(self, argv: list[str]):
        from calibrl.backends.openrlhf.command import check_openrlhf_argv

        self.args = check_openrlhf_argv(argv)

    def state(self) -> dict:
        import json
        from pathlib import Path

        import openrlhf.trainer.ppo_utils.experience_maker as em

        from calibrl.backends.openrlhf import steps
        from calibrl.backends.openrlhf.patching import MARK

        settings = os.environ["CALIBRL_SETTINGS"]
        return {
            "settings": settings,
            "stop_at": json.loads((Path(settings).parent / steps.SEGMENT).read_text())["stop_at"],
            "iac_patched": "iac" in getattr(em.RemoteExperienceMaker.compute_advantages_and_returns, MARK, ()),
            "step_limit": "steps" in getattr(BasePPOTrainer.train_step, MARK, ()),
            "is_trainer": isinstance(self, BasePPOTrainer),
            "pid": os.getpid(),
        }

    def advantages(self, rewards: list[list[float]], calibrated: bool, seed: int = 0) -> list[list[float]]:
        """OpenRLHF's (P, G) group advantages for binary ``rewards``: with the IAC patch the setup hook installed,
        or OpenRLHF's own method under it."""
        import openrlhf.trainer.ppo_utils.experience_maker as em
        from openrlhf.trainer.ppo_utils.experience import Experience

        self.args.rollout.n_samples_per_prompt = len(rewards[0])  # the paper's G = 8 would need 8 per group
        self.args.rollout.micro_batch_size = 3  # ragged micro-batches: the patch must regroup by index
        rng = random.Random(seed)
        samples = []
        for r in [x for row in rewards for x in row]:
            prompt, response = rng.randint(2, 5), rng.randint(1, 6)
            action = torch.zeros(1, prompt + response - 1, dtype=torch.long)
            action[0, prompt - 1 :] = 1
            samples.append(
                Experience(
                    sequences=torch.randint(3, 50, (1, prompt + response)),
                    attention_mask=torch.ones(1, prompt + response, dtype=torch.long),
                    action_mask=action,
                    rewards=torch.tensor([r]),
                    scores=torch.tensor([r]),
                    response_length=torch.tensor([response]),
                    truncated=torch.tensor([False]),
                    total_length=torch.tensor([float(prompt + response)]),
                    prompts=["q"],
                    labels=["a"],
                    info={"reward": torch.tensor([r])},
                )
            )
        maker = em.RemoteExperienceMaker.__new__(em.RemoteExperienceMaker)
        maker.strategy, maker.args = SimpleNamespace(args=self.args), self.args
        maker.advantage_estimator = self.args.algo.advantage.estimator
        maker.kl_ctl = SimpleNamespace(value=0.0)
        maker.tokenizer = SimpleNamespace(pad_token_id=0)
        experiences = maker.split_rollout_samples(samples)
        for e in experiences:
            e.kl = torch.zeros(e.action_mask.shape)
        rng.shuffle(experiences)
        method = em.RemoteExperienceMaker.compute_advantages_and_returns
        out = (method if calibrated else method.__wrapped__)(maker, experiences)
        index = torch.tensor([i for e in out for i in e.index])
        flat = torch.cat([e.advantages[:, 0] for e in out])
        grouped = torch.empty_like(flat)
        grouped[index] = flat
        return grouped.view(len(rewards), -1).tolist()


class RewardHost:
    """OpenRLHF's single-turn agent executor in an async actor: the reward file graded as in a rollout."""

    def __init__(self, reward_path: str):
        from openrlhf.utils.agent import SingleTurnAgentExecutor

        self.executor = SingleTurnAgentExecutor(remote_rm_url=reward_path)

    async def grade(self, queries: list[str], prompts: list[str], labels: list[str]) -> list[dict]:
        calls = [self.executor._fetch_rewards_via_func([q], [p], [a]) for q, p, a in zip(queries, prompts, labels)]
        results = await asyncio.gather(*calls)  # one sample per call, all at once, as rollouts arrive
        return [{"scores": float(r[0]["scores"]), "pid": os.getpid()} for r in results]

    def workers(self) -> list[int]:
        """The grading pool's worker processes (reward.py's), children of this actor."""
        import multiprocessing

        return [p.pid for p in multiprocessing.active_children()]
