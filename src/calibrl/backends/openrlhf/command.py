"""OpenRLHF 0.11.2's command line for one run, built from the run's ``settings.json``, and a check against
OpenRLHF's own parser.

``build_command(stamp, run_dir, data_path, rows)`` reads everything from ``stamp`` (the run's settings.json,
``calibrl.checkpoints.RunStamp``): the compiled method (``method``, a ``calibrl.spec.MethodSpec``), the
shared training settings (``train``), the input folders (``paths``) and the GPU layout (``resources``,
``calibrl.backends.openrlhf.layout``, defaults from the config schema). The launcher calls it in the job, right
before it runs OpenRLHF; what OpenRLHF has no flag for reaches its Ray workers through the setup hook
(``hook``), which reads the same settings.json.

Flag names and defaults are OpenRLHF 0.11.2's (``openrlhf/cli/train_ppo_ray.py``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from calibrl.backends.openrlhf.data import LABEL_KEY, PROMPT_KEY
from calibrl.backends.openrlhf.layout import run_roles
from calibrl.checkpoints import RunStamp

ESTIMATORS = {"grpo": "group_norm", "rloo": "rloo", "rpp": "reinforce_baseline", "drgrpo": "dr_grpo"}
"""calibrl estimator -> OpenRLHF ``--algo.advantage.estimator``: the estimators both implement alike."""
DAPO_EPISODE_FACTOR = 10
"""DAPO consumes B / pass-rate prompts a step: its runs get this many times the data (a pass rate down to 1/10)."""


def fmt(x) -> str:
    """One spelling for every float of the command."""
    return repr(float(x))


def episodes_and_samples(steps: int, batch: int, rows: int, dapo: bool) -> tuple[int, int]:
    """(``--train.num_episodes``, ``--data.max_samples``) for ``steps`` steps of ``batch`` prompts over all ``rows``.

    OpenRLHF has no max-steps flag: it runs ``num_episodes`` passes over the first ``max_samples`` prompts, a step
    every ``batch`` of them. Every prompt is in the passes (M = rows), as verl's epochs over the whole file are
    (DeepScaleR, N = 40,315, S = 2000, B = 64: 629 full steps a pass, E = 4 passes, ~3.2 of them used), and the
    step limit (``steps``) stops at exactly S. A pass's last ``rows % batch`` prompts make a partial batch, which
    the step limit drops rather than take a smaller optimizer step. DAPO's dynamic sampling drops groups whose
    samples all score the same and refills the batch, so a step consumes B / pass-rate prompts: its runs get
    ``DAPO_EPISODE_FACTOR`` times the passes."""
    per_pass = rows // batch
    if per_pass < 1:
        raise ValueError(f"the training prompts are {rows}, fewer than one step's {batch}")
    episodes = -(-steps // per_pass)
    return episodes * (DAPO_EPISODE_FACTOR if dapo else 1), rows


def train_samples(train: dict) -> int:
    """Samples per optimizer step, OpenRLHF's ``--train.batch_size``: a step's B x G samples over
    ``ppo_minibatches`` (whole groups each: the config check refuses a B it does not divide)."""
    batch, group, k = int(train["prompts_per_step"]), int(train["group_size"]), int(train["ppo_minibatches"])
    if batch % k:
        raise ValueError(f"grid.train.ppo_minibatches {k} does not divide grid.train.prompts_per_step {batch}")
    return batch // k * group


def build_command(stamp: RunStamp | dict, run_dir: str | Path, data_path: str | Path, rows: int) -> list[str]:
    """OpenRLHF's argv (after ``python -m openrlhf.cli.train_ppo_ray``) for the run of ``stamp`` (its
    settings.json, or that file's content), whose folder is ``run_dir`` and whose prepared prompt file (``rows``
    prompts) is ``data_path``. Every path is absolute: Ray actors run elsewhere."""
    stamp = RunStamp.of(stamp)
    layout, spec, train = stamp.resources, stamp.method, stamp.train
    if spec.estimator not in ESTIMATORS:
        raise ValueError(f"method {spec.name!r}: estimator {spec.estimator!r} has no OpenRLHF estimator; "
                         f"one of {sorted(ESTIMATORS)}")  # fmt: skip
    run = Path(run_dir).resolve()
    ckpt = run / "ckpt" / "openrlhf"
    res = run_roles(layout, spec)["resources"]
    steps, batch, group = int(train["steps"]), int(train["prompts_per_step"]), int(train["group_size"])
    episodes, max_samples = episodes_and_samples(steps, batch, int(rows), spec.dynamic_sampling)
    max_new = int(train["max_new_tokens"])

    # ---- model, data, prompt: the prompts are rendered already (chat template included, data.write_prompts)
    argv = ["--actor.model_name_or_path", str(Path(stamp.paths["init"]).resolve())]
    argv += ["--train.seed", str(int(stamp.seed))]
    argv += ["--data.prompt_dataset", str(Path(data_path).resolve()), "--data.prompt_split", "train"]
    argv += ["--data.input_key", PROMPT_KEY, "--data.label_key", LABEL_KEY]
    argv += ["--data.max_samples", str(max_samples), "--train.num_episodes", str(episodes)]
    argv += ["--data.max_len", str(int(train["max_prompt_len"]) + max_new), "--rollout.max_new_tokens", str(max_new)]

    # ---- batch: B prompts, G samples each, then k = grid.train.ppo_minibatches optimizer steps on B*G/k samples
    # each (verl's ppo_mini_batch_size B/k prompts, one PPO epoch): from the second mini-batch on the policy has
    # moved, its ratio to the rollout policy leaves 1 and the clip (DAPO's clip-higher) binds. OpenRLHF splits its
    # replay buffer into B*G/k-sample optimizer steps (ppo_actor.ppo_train, replay_buffer.setup_dynamic_batch);
    # its global_step still counts rollout steps (the step limit, the checkpoints).
    argv += ["--rollout.batch_size", str(batch), "--rollout.n_samples_per_prompt", str(group)]
    argv += ["--train.batch_size", str(train_samples(train)), "--train.max_epochs", "1"]
    argv += ["--rollout.temperature", fmt(train["temperature"]), "--rollout.top_p", fmt(train["top_p"])]
    argv += ["--rollout.micro_batch_size", str(res["micro_rollout_batch_size"])]
    argv += ["--train.micro_batch_size", str(res["micro_train_batch_size"])]

    # ---- optimizer (the paper: AdamW, lr 1e-6). OpenRLHF's defaults differ from verl's (betas 0.9/0.95, weight
    # decay 0, cosine_with_min_lr with 3% warmup); set verl's: betas 0.9/0.999, grid.train.weight_decay (verl's
    # 0.01), constant lr without warmup, gradient clipping at grid.train.grad_clip. The decay's scope is
    # grid.train.weight_decay_scope: OpenRLHF exempts biases and norm weights by name, which no flag changes; for
    # scope all (verl's) the setup hook's decay_scope patch makes it decay every parameter.
    argv += ["--actor.adam.lr", fmt(train["lr"]), "--actor.adam.betas", "0.9", "0.999"]
    argv += ["--actor.adam.weight_decay", fmt(train["weight_decay"])]
    argv += ["--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0.0"]
    argv += ["--actor.max_norm", fmt(train["grad_clip"])]

    # ---- algorithm: the spec's switches as OpenRLHF's flags
    # Dr. GRPO's seq-mean-token-sum-norm is token-mean with the step's token count replaced by B x max_new_tokens:
    # loss_norm.py does that inside OpenRLHF (installed by the setup hook for that aggregation).
    loss_agg = {"seq-mean-token-sum-norm": "token-mean"}.get(spec.loss_agg, spec.loss_agg)
    if loss_agg not in ("token-mean", "seq-mean-token-mean"):
        raise ValueError(f"method {spec.name!r}: loss_agg {spec.loss_agg!r} has no OpenRLHF --actor.loss_agg_mode")
    argv += ["--algo.advantage.estimator", ESTIMATORS[spec.estimator], "--actor.loss_agg_mode", loss_agg]
    # OpenRLHF clips every group advantage to --reward.clip_range before spreading it over the tokens (default
    # -10..10); verl does not. IAC's calibrated advantages exceed 10 (G=8, one success: 2.47 * 7^alpha = 17.3 at
    # alpha=1), so the clip is opened for every method (plain advantages stay below 2.5). Integers: argparse
    # takes "-1e6" for an option, "-1000000" not.
    argv += ["--reward.clip_range", "-1000000", "1000000"]
    argv += ["--reward.remote_url", str(Path(__file__).with_name("reward.py"))]  # a .py file: its reward_func
    argv += ["--actor.entropy_coef", "0"]  # 0: no entropy loss, but the policy entropy is logged (Figure 6)
    # PPO clip (DAPO: clip-higher) and dual clip (verl's clip_ratio_c: 3, DAPO's recipe 10), from the spec
    argv += ["--actor.eps_clip_low_high", fmt(spec.clip_low), fmt(spec.clip_high)]
    argv += ["--actor.dual_clip", fmt(spec.dual_clip), "--algo.kl.init_coef", fmt(spec.kl_coef)]
    if spec.uses_kl:
        # One KL for every baseline, as the paper runs all of them "in the same setting", and as the CPU trainer
        # does: verl's GRPO recipe, KL as a loss (use_kl_loss, kl_loss_coef 1e-3, low_var_kl = k3).
        argv += ["--algo.kl.use_loss", "--algo.kl.estimator", spec.kl_estimator]
    if spec.dynamic_sampling:
        # DAPO's dynamic sampling, metric acc: keep a group iff 0 < mean score < 1 (the scores are reward.py's 0/1
        # correctness, whatever the rewards' scale). verl's max_num_gen_batches has no OpenRLHF counterpart: it
        # refills until the data run out.
        argv += ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.0", "1.0"]
    if spec.overlong_cache is not None:
        from calibrl.algo.dapo import PENALTY_FACTOR  # torch: only where a DAPO command is built

        # OpenRLHF adds the penalty to reward.py's rewards, DAPO's +1 / -1 (spec.reward), as verl's DAPO reward
        # manager adds it to math_dapo's score; the scores stay 0/1
        argv += ["--reward.overlong_buffer_len", str(spec.overlong_cache)]
        argv += ["--reward.overlong_penalty_factor", fmt(PENALTY_FACTOR)]
    if spec.dlc_importance == "truncated":
        # DLC samples from softmax(f_theta - mu f_phi), not pi_theta; "truncated": clamp(pi_theta_old / pi_sample,
        # 0.5, 5) per token (calibrl.algo.dlc.importance_weights, as the CPU trainer), OpenRLHF's token/clip IS
        # correction, whose rollout logprobs are the composite engine's. "none" (Algorithm 1 line 20 as written):
        # OpenRLHF's is_correction stays off and its PPO ratio is against pi_theta_old recomputed by the actor.
        from calibrl.algo.dlc import IMPORTANCE_BOUNDS

        argv += ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip"]
        argv += ["--algo.advantage.is_correction_threshold", *(fmt(b) for b in IMPORTANCE_BOUNDS)]

    # ---- checkpoints: DeepSpeed state for resuming every ds_save_steps (rotated, keep_ds_checkpoints kept) and a
    # Hugging Face copy at every eval_every steps, {ckpt}/global_step{k}_hf, never rotated (OpenRLHF saves both at
    # --ckpt.save_steps: the save_cadence patch skips the copy between evaluated steps); --ckpt.load_enable resumes
    # from {ckpt}/_actor. The output_dir's full model at the end of fit is never written (launch.skip_final_save).
    saves = res.get("ds_save_steps") or train["eval_every"]
    argv += ["--ckpt.path", str(ckpt), "--ckpt.save_steps", str(int(saves)), "--ckpt.save_hf"]
    argv += ["--ckpt.load_enable", "--ckpt.max_num", str(res["keep_ds_checkpoints"])]
    argv += ["--ckpt.output_dir", str(ckpt / "final"), "--ckpt.best_metric_key", "none"]
    argv += ["--logger.tensorboard_dir", str(run / "tensorboard")]
    argv += ["--logger.wandb.run_name", stamp.run.replace("/", "_"), "--logger.logging_steps", "1"]

    # ---- placement (``layout``): actor (DeepSpeed), reference (only built with a KL), vLLM engines
    argv += ["--actor.num_nodes", str(res["actor_nodes"]), "--actor.num_gpus_per_node", str(res["actor_gpus_per_node"])]
    argv += ["--ref.num_nodes", str(res["ref_nodes"]), "--ref.num_gpus_per_node", str(res["ref_gpus_per_node"])]
    argv += ["--vllm.num_engines", str(res["vllm_engines"])]
    argv += ["--vllm.tensor_parallel_size", str(res["vllm_tensor_parallel_size"])]
    argv += ["--vllm.gpu_memory_utilization", fmt(res["vllm_gpu_memory_utilization"])]
    if res["prefix_caching"]:
        argv += ["--vllm.enable_prefix_caching"]  # the G samples of a prompt share its prefix
    if res["colocate_all"]:
        argv += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    argv += ["--ds.zero_stage", str(res["zero_stage"])]
    if res["gradient_checkpointing"]:
        argv += ["--actor.gradient_checkpointing_enable"]
    if res["packing_samples"] or res["dynamic_batch"]:
        argv += ["--ds.packing_samples"]  # no padding tokens; needs flash-attn (docs/cluster.md)
    if res["dynamic_batch"]:
        # micro-batches of at most N tokens (one sequence is up to max_prompt_len + max_new_tokens): the memory of a
        # forward is bounded by N, not by the count of samples times the longest
        tokens = str(int(res["max_tokens_per_gpu"]))
        argv += ["--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", tokens]
        argv += ["--rollout.max_tokens_per_gpu", tokens]
    if res["ref_offload"]:
        argv += ["--ref.offload"]  # the frozen reference in CPU memory between its forwards
    if res["adam_offload"]:
        argv += ["--ds.adam_offload"]
    argv += [str(a) for a in res["extra_args"]]
    return argv


def _main_block() -> tuple[list[ast.stmt], str]:
    """The statements under ``if __name__ == "__main__":`` of OpenRLHF's ``train_ppo_ray`` and its path."""
    spec = importlib.util.find_spec("openrlhf.cli.train_ppo_ray")
    if spec is None or not spec.origin:
        raise ModuleNotFoundError("openrlhf is not installed (pip install openrlhf==0.11.2)")
    source = Path(spec.origin).read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            return node.body, spec.origin
    raise RuntimeError(f"{spec.origin}: no `if __name__ == '__main__':` block; OpenRLHF changed its CLI layout")


def check_openrlhf_argv(argv: list[str]) -> SimpleNamespace:
    """Parse and validate OpenRLHF's argv exactly as ``train_ppo_ray`` does, without training.

    The whole main block runs (parse, ``hierarchize``, OpenRLHF's own assertions) with ``train`` replaced by
    a function that keeps its ``args``; those nested args are returned. A bad flag or value raises
    ValueError with argparse's message; a failed OpenRLHF assertion raises AssertionError.
    """
    body, origin = _main_block()
    seen: list[SimpleNamespace] = []
    namespace = {"argparse": argparse, "datetime": datetime, "os": __import__("os"), "train": seen.append}
    saved, err = sys.argv, io.StringIO()
    sys.argv = ["train_ppo_ray", *argv]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(ast.Module(body=body, type_ignores=[]), origin, "exec"), namespace)
    except SystemExit as exc:  # argparse reports errors by exiting
        raise ValueError(f"OpenRLHF rejects the command line: {err.getvalue().strip()}") from exc
    finally:
        sys.argv = saved
    if len(seen) != 1:
        raise RuntimeError(f"{origin}: the main block did not reach train(args)")
    return seen[0]
