"""The launcher's runtime environment in real Ray 2.55 (CPU, ``.venv-vllm``, with OpenRLHF 0.11.2 installed):

* a Ray actor that subclasses OpenRLHF's trainer base gets the IAC patch and the step limit from the setup
  hook and the one variable ``launch.runtime_env`` sets (the run's settings.json), and OpenRLHF's own experience
  maker there returns ``calibrl.algo.advantages.iac`` of OpenRLHF's plain group advantages (alpha from the run's
  compiled method);
* the reward file runs in an async Ray actor through OpenRLHF's ``SingleTurnAgentExecutor`` (as in a vLLM
  rollout actor), with its grading worker processes, and grades real responses.

GPU-only modules (DeepSpeed, flash-attn; datasets) are stubbed in each worker by a test-only hook
(tests/ray_openrlhf_hook.py) that then runs the launcher's real hook.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from calibrl.algo.advantages import iac

pytestmark = pytest.mark.vllm
ray = pytest.importorskip("ray")
pytest.importorskip("openrlhf")

TESTS = Path(__file__).resolve().parent
REWARDS = [[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]]


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    """The settings.json of a paper IAC run (alpha 1), in a segment that stops at step 7."""
    from conftest import filled, paper_settings

    from calibrl import grid as G
    from calibrl.backends.openrlhf import steps

    path = paper_settings(filled("paper"), G.Run("qwen3-8b", "iac", 0), tmp_path_factory.mktemp("run"))
    steps.write_segment(path.parent, 7)
    return path


@pytest.fixture(scope="module")
def cluster(settings):
    """Ray with the launcher's runtime environment, the test hook in front of its hook."""
    import ray_openrlhf_hook

    from calibrl.backends.openrlhf import launch

    env = launch.runtime_env(settings)
    env["env_vars"] = {
        **env["env_vars"],
        "CALIBRL_TEST_REAL_HOOK": env["worker_process_setup_hook"],
        "CALIBRL_REWARD_WORKERS": "2",
        "PYTHONPATH": f"{TESTS}:{env['env_vars']['PYTHONPATH']}",
    }
    env["worker_process_setup_hook"] = "ray_openrlhf_hook.setup"
    before = set(sys.modules)
    stubbed = ray_openrlhf_hook.stub_gpu_only()  # the driver imports the actor classes too
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
    try:
        import ray_openrlhf_probe

        yield ray_openrlhf_probe
    finally:
        ray.shutdown()
        for name in set(sys.modules) - before:
            if name.startswith(("openrlhf", "ray_openrlhf_probe")) or name in stubbed:
                del sys.modules[name]


def _argv(settings: Path) -> list[str]:
    """The run's OpenRLHF argv, as the launcher builds it."""
    import json

    from calibrl.backends.openrlhf import command

    return command.build_command(json.loads(settings.read_text()), settings.parent, settings.parent / "p.jsonl", 40315)


def test_iac_patch_is_active_in_a_trainer_actor(cluster, settings):
    probe = ray.remote(num_cpus=1)(cluster.Probe).remote(_argv(settings))
    state = ray.get(probe.state.remote())
    assert state["is_trainer"] and state["iac_patched"] and state["step_limit"]
    assert state["settings"] == str(settings.resolve()) and state["stop_at"] == 7  # the one variable, the segment
    assert state["pid"] != os.getpid()  # a Ray worker process, not this one
    plain = torch.tensor(ray.get(probe.advantages.remote(REWARDS, False)))
    calibrated = torch.tensor(ray.get(probe.advantages.remote(REWARDS, True)))
    assert torch.allclose(calibrated, iac(plain, 1.0), atol=1e-6)
    assert not torch.allclose(calibrated, plain)  # the calibration acted: the lone success of group 0 x 3
    assert calibrated[0, 0] == pytest.approx(plain[0, 0].item() * 3, rel=1e-5)


def test_reward_function_grades_in_an_async_actor_with_worker_processes(cluster):
    reward = str(Path(cluster.__file__).parents[1] / "src" / "calibrl" / "backends" / "openrlhf" / "reward.py")
    host = ray.remote(num_cpus=1)(cluster.RewardHost).remote(reward)
    prompt = "<|im_start|>user\nWhat is 6 x 7?<|im_end|>\n<|im_start|>assistant\n"
    answers = ["The answer is \\boxed{42}.", "So \\boxed{41}", "\\boxed{\\frac{84}{2}}", "no box at all"] * 3
    queries = [prompt + a + "<|im_end|>" for a in answers]
    graded = ray.get(host.grade.remote(queries, [prompt] * len(queries), ["42"] * len(queries)))
    assert [g["scores"] for g in graded] == [1.0, 0.0, 1.0, 0.0] * 3
    workers = ray.get(host.workers.remote())
    # the reward file's grading pool: worker processes of the actor (spawned on demand, at most 2)
    assert 1 <= len(workers) <= 2 and graded[0]["pid"] not in workers
