"""The verl backend: every method of config/paper.yaml as verl 0.9.1's own config (composed by verl's Hydra and typed
by its dataclasses, in .venv-verl), the keys it refuses, its stand-ins, its checkpoint bookkeeping and metrics.

The ``verl``-marked tests import the real verl (``CALIBRL_REQUIRE_VERL=1 .venv-verl/bin/python -m pytest -m verl
tests/test_verl.py``); the others run in the main venv. The numerical parity of verl's functions with
``calibrl.algo`` is tests/test_verl_parity.py; a real ``main_ppo`` run through SLURM is tests/test_rehearsal_verl.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO, copy_workflow, paper_settings, snakemake

from calibrl import config as C
from calibrl import grid as G
from calibrl.backends.verl import cpu_platform, hf_copies, launch
from calibrl.backends.verl.metrics import file_metrics
from calibrl.checkpoints import RunStamp

PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
HAVE_VERL = importlib.util.find_spec("verl") is not None
requires_verl = pytest.mark.skipif(
    not HAVE_VERL and not os.environ.get("CALIBRL_REQUIRE_VERL"),
    reason="verl is not installed: .venv-verl runs these (CALIBRL_REQUIRE_VERL=1: fail instead)",
)


def verl_paper() -> dict:
    cfg = copy.deepcopy(PAPER)
    cfg["grid"]["trainer"] = "verl"
    return C.validate(cfg)


# ---------------------------------------------------------------------------------------------- config
@pytest.mark.slow
def test_the_paper_grid_plans_under_verl_in_verls_venv(tmp_path, monkeypatch):
    """The users' command with the second trainer: every job of the paper grid planned (as under OpenRLHF), the SLURM
    jobs' venv verl's own."""
    monkeypatch.delenv("CALIBRL_GPU_VENV", raising=False)
    copy_workflow(tmp_path)
    text = snakemake(tmp_path, "-n", "--configfile", "config/paper.yaml", "--config", "grid={trainer: verl}").stdout
    table = text.split("Job stats:")[1].split("total")[0].splitlines()[3:]
    stats = dict(line.split() for line in table if line.strip())
    assert stats["train"] == "158" and stats["evaluate"] == "880" and stats["preflight"] == "2", stats
    assert f"SLURM jobs' venv: {tmp_path / '.venv-gpu-verl'}" in text


def test_the_paper_grid_validates_under_verl_with_the_same_layouts():
    """config/paper.yaml's layouts use only keys verl's layout has (the same names, verl's meaning)."""
    cfg = verl_paper()
    assert {r.method for r in G.runs(cfg)} == set(PAPER["grid"]["methods"])
    for run in G.runs(cfg):
        lay = G.resources(cfg, run)
        assert lay["colocate_all"] is True and G.request(cfg, run)["gres"].startswith("gpu:")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda g: g["models"]["qwen3-8b"]["resources"].update(colocate_all=False), "colocate_all"),
        (lambda g: g["models"]["qwen3-8b"]["resources"].update(vllm_engines=2), "vllm_engines"),
        (lambda g: g["models"]["qwen3-8b"]["resources"].update(zero_stage=1), "zero_stage"),
        (lambda g: g["methods"]["grpo"].update(shuffle_rewards=True), "grid.methods.grpo.shuffle_rewards"),
        (lambda g: g["train"].update(weight_decay_scope="no_bias_norm"), "grid.train.weight_decay_scope"),
        (lambda g: g["train"].update(dlc_importance="truncated"), "grid.train.dlc_importance"),
        (lambda g: g.update(chat_template=False), "grid.chat_template"),
        (lambda g: g["train"].update(dapo_max_gen_batches=7), "dapo_max_gen_batches"),
    ],
)
def test_verl_refuses_what_it_cannot_do_by_key(change, key):
    cfg = copy.deepcopy(PAPER)
    cfg["grid"]["trainer"] = "verl"
    change(cfg["grid"])
    with pytest.raises(C.ConfigError, match=key.replace(".", r"\.")):
        C.validate(cfg)


def test_the_cpu_standins_are_a_pinned_list():
    """A new stand-in is a decision: this list changes with it. Each names the symbol it replaces."""
    assert [s.target for s in cpu_platform.STANDINS] == [
        "torch.distributed:init_process_group",
        "importlib.metadata:version",
        "verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy",
    ]
    assert all(s.why for s in cpu_platform.STANDINS)
    for name in ("paper", "cluster_smoke"):  # no cluster config switches them on
        cfg = yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())
        assert not any((m.get("resources") or {}).get("cpu_rehearsal") for m in cfg["grid"]["models"].values())


def test_cpu_overrides_come_last_and_keep_hydras_plus_rule():
    out = cpu_platform.cpu_overrides(["a=1", "+actor_rollout_ref.rollout.enable_sleep_mode=True"])
    assert out[:2] == ["a=1", "+actor_rollout_ref.rollout.enable_sleep_mode=True"]
    assert "actor_rollout_ref.rollout.enable_sleep_mode=False" in out  # given again without the +
    assert out[-len(cpu_platform.OVERRIDES) :][0] == "trainer.device=cpu"


# ----------------------------------------------------------------------------------- verl's own config
@pytest.mark.verl
@requires_verl
@pytest.mark.parametrize("method", list(PAPER["grid"]["methods"]))
def test_every_paper_method_is_verls_own_config(method, tmp_path):
    """The overrides of the 8B run of each method, composed by verl's Hydra and typed by its dataclasses as main_ppo
    does: the estimator (IAC's registered twin), the loss, the clip, the KL, DAPO's reward manager and filter."""
    from calibrl.backends.verl import advantage
    from calibrl.backends.verl.command import build_overrides, check_overrides

    cfg = verl_paper()
    path = paper_settings(cfg, G.Run(cfg["grid"]["main_model"], method, 0), tmp_path)
    stamp = RunStamp.read(path)
    spec = stamp.method
    config = check_overrides(build_overrides(stamp, path.parent, tmp_path / "p.parquet", 40315, 500))
    algo, actor = config.algorithm, config.actor_rollout_ref.actor
    plain, norm = advantage.PLAIN[spec.estimator]
    assert algo.adv_estimator == (advantage.IAC_ESTIMATORS[spec.estimator] if spec.uses_iac else plain)
    assert algo.norm_adv_by_std_in_grpo == norm and not algo.use_kl_in_reward
    assert actor.loss_agg_mode == spec.loss_agg and actor.use_kl_loss == spec.uses_kl
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (
        spec.clip_low, spec.clip_high, spec.dual_clip)  # fmt: skip
    if spec.loss_agg == "seq-mean-token-sum-norm":  # else verl divides by the padded width (test_verl_parity)
        assert actor.loss_scale_factor == cfg["grid"]["train"]["max_new_tokens"]
    assert algo.filter_groups.enable == spec.dynamic_sampling
    assert (config.reward.reward_manager.name == "dapo") == spec.dapo
    assert config.trainer.total_training_steps == 500 and config.trainer.test_freq == -1
    assert actor.ppo_mini_batch_size == 64 // cfg["grid"]["train"]["ppo_minibatches"]
    assert config.actor_rollout_ref.rollout.n == 8 and config.data.train_batch_size == 64
    assert "hf_model" in actor.checkpoint.save_contents
    if spec.uses_dlc:  # the composite model (calibrl.gpu.vllm_dlc) in verl's vLLM replicas
        hf = json.loads(config.actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides)
        assert hf["dlc_mu"] == spec.dlc_mu and hf["dlc_memory_path"] == stamp.paths["memory"]


# ------------------------------------------------------------------------------ checkpoints, metrics
def _saved(ckpt: Path, step: int) -> None:
    hf = ckpt / f"global_step_{step}" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")


def test_evaluated_copies_are_kept_outside_verls_rotation_and_others_removed(tmp_path):
    ckpt = tmp_path / "ckpt" / "verl"
    for step in (1, 2):
        _saved(ckpt, step)
    assert hf_copies.keep_hf(ckpt, 1, {2, 4}) is None
    assert not (ckpt / "global_step_1" / "actor" / "huggingface").exists()
    target = hf_copies.keep_hf(ckpt, 2, {2, 4})
    assert target == ckpt / "hf" / "global_step2_hf" and (target / "config.json").is_file()
    assert hf_copies.keep_hf(ckpt, 2, {2, 4}) == target  # idempotent


def test_repair_rewinds_a_save_without_its_copy_and_markers_follow(tmp_path):
    """A job killed between verl's save of an evaluated step and the move of its Hugging Face copy (before the step's
    metrics were logged): the next attempt discards that state and rewinds verl's tracker to the one before, which it
    trains from again; a save beyond the tracker (unfinished) is left to verl, which saves that step again."""
    run = tmp_path / "run"
    ckpt = run / "ckpt" / "verl"
    stamp = RunStamp.build({"train": {"eval_every": 2, "steps": 6}}, {})
    for step in (2, 4, 6):
        _saved(ckpt, step)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("4")
    launch.repair(ckpt, stamp)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2" and not (ckpt / "global_step_4").exists()
    assert (ckpt / "hf" / "global_step2_hf").is_dir() and (ckpt / "global_step_6").is_dir()
    assert launch.write_markers(ckpt, run / "ckpt", 2, 6) == [2]
    assert json.loads((run / "ckpt" / "step_2.done").read_text())["step"] == 2
    launch.repair(ckpt, stamp)  # idempotent
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    shutil.rmtree(ckpt / "global_step_2")
    _saved(ckpt, 2)
    (ckpt / "hf" / "global_step2_hf").rename(tmp_path / "gone")
    launch.repair(ckpt, stamp)  # the first save itself without its copy: from scratch
    assert not (ckpt / "latest_checkpointed_iteration.txt").exists()


def test_metrics_take_each_step_from_its_last_launch(tmp_path):
    logs = tmp_path / "metrics"
    logs.mkdir()
    rows = [{"step": 1, "data": {"actor/entropy": 0.5, "actor/pg_loss": -1.0, "note": "text"}},
            {"step": 2, "data": {"actor/entropy": 0.4}}]  # fmt: skip
    (logs / "launch-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (logs / "launch-2.jsonl").write_text(json.dumps({"step": 2, "data": {"actor/entropy": 0.3}}) + "\n")
    file_metrics(logs, tmp_path / "m.jsonl")
    got = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert got == [{"step": 1, "entropy": 0.5, "actor/pg_loss": -1.0}, {"step": 2, "entropy": 0.3}]
