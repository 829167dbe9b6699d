"""verl 0.9.1's Hydra overrides for one run (``python -m verl.trainer.main_ppo <overrides>``), built from the run's
``settings.json``, and a check against verl's own config.

``build_overrides(stamp, run_dir, data_path, rows, stop_at)`` reads everything from ``stamp``
(``calibrl.checkpoints.RunStamp``): the compiled method (``method``), the shared training settings (``train``), the
input folders (``paths``) and the GPU layout (``resources``, ``layout.schema.yaml``). What verl has no option for
reaches its processes through the external module (``external``), which reads the same settings.json.
:func:`check_overrides` composes verl's config from them with Hydra and turns it into verl's typed configs, as
``main_ppo`` does, without training: a typo or a value verl rejects fails in the job before Ray starts.

Option names and defaults are verl 0.9.1's (``verl/trainer/config/_generated_ppo_trainer.yaml``).
"""

from __future__ import annotations

from pathlib import Path

from calibrl.backends.verl.advantage import algorithm_overrides
from calibrl.checkpoints import RunStamp

TRAINER = "calibrl"
"""The v1 trainer mode the external module registers (``trainer.PPOTrainerCalibrl``)."""
KL_TYPES = {"k1": "kl", "k3": "low_var_kl"}
"""calibrl KL estimator -> verl's ``kl_loss_type``."""
DAPO_EPOCH_FACTOR = 10
"""DAPO consumes B / pass-rate prompts a step: its runs get this many times the passes over the data."""
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
MODEL = "actor_rollout_ref.model"


def fmt(x) -> str:
    """One spelling for every float of the overrides."""
    return repr(float(x))


def ckpt_dir(run_dir: str | Path) -> Path:
    """verl's ``trainer.default_local_dir`` of a run: its resume states ``global_step_{k}/`` and the tracker."""
    return Path(run_dir).resolve() / "ckpt" / "verl"


def epochs(steps: int, batch: int, rows: int, dapo: bool) -> int:
    """``trainer.total_epochs``: enough passes over the ``rows`` prompts for ``steps`` steps of ``batch`` (verl drops
    a pass's last partial batch, ``drop_last``); DAPO's dynamic sampling consumes more a step."""
    per_pass = rows // batch
    if per_pass < 1:
        raise ValueError(f"the training prompts are {rows}, fewer than one step's {batch}")
    return -(-steps // per_pass) * (DAPO_EPOCH_FACTOR if dapo else 1)


def build_overrides(stamp: RunStamp | dict, run_dir: str | Path, data_path: str | Path, rows: int,
                    stop_at: int) -> list[str]:  # fmt: skip
    """verl's Hydra overrides for the run of ``stamp`` up to step ``stop_at``, whose folder is ``run_dir`` and whose
    prepared prompt file (``rows`` prompts, ``data.prepare``) is ``data_path``. Every path is absolute."""
    stamp = RunStamp.of(stamp)
    lay, spec, train = stamp.resources, stamp.method, stamp.train
    run = Path(run_dir).resolve()
    steps, batch, group = int(train["steps"]), int(train["prompts_per_step"]), int(train["group_size"])
    max_new, max_prompt = int(train["max_new_tokens"]), int(train["max_prompt_len"])
    k = int(train["ppo_minibatches"])
    if batch % k:
        raise ValueError(f"grid.train.ppo_minibatches {k} does not divide grid.train.prompts_per_step {batch}")
    algo = algorithm_overrides(spec.estimator, spec.iac_alpha)  # verl's estimator, or its IAC twin (advantage)
    ov = []

    # ---- data: the prepared parquet (prompts as one user turn, in the data seed's order: no reshuffle), the model's
    # chat template applied by verl with the run's thinking switch, as evaluation renders them (data.py)
    ov += [f"data.train_files={Path(data_path).resolve()}", f"data.val_files={Path(data_path).resolve()}"]
    ov += ["data.prompt_key=prompt", "data.shuffle=False", f"data.seed={int(stamp.seed)}"]
    ov += [f"data.train_batch_size={batch}", f"data.max_prompt_length={max_prompt}"]
    ov += [f"data.max_response_length={max_new}", "data.filter_overlong_prompts=False", "data.truncation=error"]
    ov += [f"+data.apply_chat_template_kwargs.enable_thinking={bool(stamp.settings['enable_thinking'])}"]
    ov += ["data.dataloader_num_workers=0"]

    # ---- model
    ov += [f"{MODEL}.path={Path(stamp.paths['init']).resolve()}"]
    ov += [f"{MODEL}.enable_gradient_checkpointing={bool(lay['gradient_checkpointing'])}"]
    ov += [f"{MODEL}.use_remove_padding={bool(lay['packing_samples'])}"]

    # ---- batch: B prompts, G samples each, then k optimizer steps of B/k prompts (ppo_mini_batch_size counts
    # prompts), one PPO epoch
    ov += [f"{ROLLOUT}.n={group}", f"{ACTOR}.ppo_mini_batch_size={batch // k}", f"{ACTOR}.ppo_epochs=1"]
    ov += [f"{ROLLOUT}.temperature={fmt(train['temperature'])}", f"{ROLLOUT}.top_p={fmt(train['top_p'])}"]
    ov += [f"{ROLLOUT}.prompt_length={max_prompt}", f"{ROLLOUT}.response_length={max_new}"]
    ov += [f"{ROLLOUT}.max_model_len={max_prompt + max_new}"]
    dynamic = bool(lay["dynamic_batch"])
    tokens = int(lay["max_tokens_per_gpu"])
    ov += [f"{ACTOR}.use_dynamic_bsz={dynamic}", f"{ACTOR}.ppo_max_token_len_per_gpu={tokens}"]
    ov += [f"{ACTOR}.ppo_micro_batch_size_per_gpu={int(lay['micro_train_batch_size'])}"]
    for role in (ROLLOUT, REF):
        ov += [f"{role}.log_prob_use_dynamic_bsz={dynamic}", f"{role}.log_prob_max_token_len_per_gpu={tokens}"]
        ov += [f"{role}.log_prob_micro_batch_size_per_gpu={int(lay['micro_rollout_batch_size'])}"]

    # ---- optimizer (the paper: AdamW, lr 1e-6): verl's own defaults are the paper's framework's (betas 0.9/0.999,
    # constant lr, no warmup); weight decay on every parameter (grid.train.weight_decay_scope all)
    ov += [f"{ACTOR}.optim.lr={fmt(train['lr'])}", f"{ACTOR}.optim.weight_decay={fmt(train['weight_decay'])}"]
    ov += [f"{ACTOR}.optim.lr_scheduler_type=constant", f"{ACTOR}.optim.lr_warmup_steps=0"]
    ov += [f"{ACTOR}.optim.lr_warmup_steps_ratio=0.0", f"{ACTOR}.optim.clip_grad={fmt(train['grad_clip'])}"]
    ov += [f"{ACTOR}.grad_clip={fmt(train['grad_clip'])}"]

    # ---- algorithm: the spec's switches as verl's options
    ov += [f"algorithm.{key}={value}" for key, value in algo.items()]
    ov += ["algorithm.use_kl_in_reward=False", f"{ACTOR}.loss_agg_mode={spec.loss_agg}"]
    if spec.loss_agg == "seq-mean-token-sum-norm":
        # Dr. GRPO's constant: the generation budget (calibrl.algo.losses); unset, verl divides by the padded width
        ov += [f"{ACTOR}.loss_scale_factor={max_new}"]
    ov += [f"{ACTOR}.clip_ratio_low={fmt(spec.clip_low)}", f"{ACTOR}.clip_ratio_high={fmt(spec.clip_high)}"]
    ov += [f"{ACTOR}.clip_ratio_c={fmt(spec.dual_clip)}", f"{ACTOR}.entropy_coeff=0"]
    ov += [f"{ACTOR}.calculate_entropy=True"]  # logged (Figure 6), no entropy loss
    ov += [f"{ACTOR}.use_kl_loss={spec.uses_kl}"]
    if spec.uses_kl:
        ov += [f"{ACTOR}.kl_loss_coef={fmt(spec.kl_coef)}", f"{ACTOR}.kl_loss_type={KL_TYPES[spec.kl_estimator]}"]
    # the reward (reward.py): math-verify correctness on the method's scale, "acc" the 0/1 correctness
    ov += ["reward.num_workers=1", f"reward.custom_reward_function.path={Path(__file__).with_name('reward.py')}"]
    ov += ["reward.custom_reward_function.name=compute_score"]
    if spec.dynamic_sampling:
        # DAPO's dynamic sampling on acc: keep a group unless its samples are all right or all wrong. verl's v1
        # replay buffer refills until the data run out (max_num_gen_batches is ignored there)
        ov += ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"]
    if spec.overlong_cache is not None:
        from calibrl.algo.dapo import PENALTY_FACTOR

        # verl's DAPO reward manager adds the overlong penalty to reward.py's +1 / -1
        ov += ["reward.reward_manager.name=dapo", f"+reward.reward_kwargs.max_resp_len={max_new}"]
        ov += ["+reward.reward_kwargs.overlong_buffer_cfg.enable=True"]
        ov += [f"+reward.reward_kwargs.overlong_buffer_cfg.len={int(spec.overlong_cache)}"]
        ov += [f"+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor={fmt(PENALTY_FACTOR)}"]
        ov += ["+reward.reward_kwargs.overlong_buffer_cfg.log=False"]

    # ---- steps, checkpoints: the resume state every ds_save_steps (rotated, keep_ds_checkpoints kept), with a
    # Hugging Face copy that the trainer keeps at the evaluated steps only (trainer.py)
    rows_epochs = epochs(steps, batch, int(rows), spec.dynamic_sampling)
    saves = int(lay.get("ds_save_steps") or train["eval_every"])
    ov += [f"trainer.total_epochs={rows_epochs}", f"trainer.total_training_steps={int(stop_at)}"]
    ov += [f"trainer.save_freq={saves}", "trainer.resume_mode=auto", f"trainer.default_local_dir={ckpt_dir(run)}"]
    ov += [f"trainer.max_actor_ckpt_to_keep={int(lay['keep_ds_checkpoints'])}"]
    ov += [f"{ACTOR}.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
    ov += [f"{ACTOR}.checkpoint.load_contents=[model,optimizer,extra]"]
    ov += ["trainer.test_freq=-1", "trainer.val_before_train=False"]  # evaluation is the workflow's (rule evaluate)
    ov += ["trainer.logger=[console,file]", "trainer.project_name=calibrl"]
    ov += [f"trainer.experiment_name={stamp.run.replace('/', '_')}", f"trainer.v1.trainer_mode={TRAINER}"]

    # ---- placement: the hybrid engine on every GPU of the allocation
    ov += [f"trainer.nnodes={int(lay['nodes'])}", f"trainer.n_gpus_per_node={int(lay['gpus_per_node'])}"]
    ov += [f"{ACTOR}.strategy=fsdp2", f"{REF}.strategy=fsdp2"]
    reshard = int(lay["zero_stage"]) == 3
    ov += [f"{ACTOR}.fsdp_config.reshard_after_forward={reshard}"]
    ov += [f"{ACTOR}.fsdp_config.optimizer_offload={bool(lay['adam_offload'])}"]
    ov += [f"{REF}.fsdp_config.param_offload={bool(lay['ref_offload'])}"]
    ov += [f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.tensor_model_parallel_size={int(lay['vllm_tensor_parallel_size'])}"]
    ov += [f"{ROLLOUT}.gpu_memory_utilization={fmt(lay['vllm_gpu_memory_utilization'])}"]
    ov += [f"{ROLLOUT}.enable_prefix_caching={bool(lay['prefix_caching'])}", f"{ROLLOUT}.dtype=bfloat16"]
    if spec.uses_dlc:
        from calibrl.backends.verl.dlc import engine_overrides

        ov += engine_overrides(spec, stamp.paths["memory"])
    ov += [str(a) for a in lay["extra_args"]]
    return ov


def check_overrides(overrides: list[str]):
    """verl's config composed from ``overrides`` as ``main_ppo`` composes it (Hydra, ``ppo_trainer``), resolved, and
    its typed parts built (``omega_conf_to_dataclass`` of the algorithm and the actor): raises with Hydra's or
    verl's message on a bad key or value. Returns the composed config."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=list(overrides))
    OmegaConf.resolve(config)
    omega_conf_to_dataclass(config.algorithm)
    omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    return config
