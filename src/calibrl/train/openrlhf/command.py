"""The command line of one OpenRLHF 0.11.2 run: ``build_command(run)``, and a check against OpenRLHF's own parser.

``run`` is a plain dict (every path absolute, or relative to the directory the command runs in)::

    name:         "qwen3-8b/iac/s0"             TensorBoard sub-folder (optional, default "calibrl")
    stop_at:      500                           optional: this job trains up to that step only (a segment of
                                                the run; the data are still sized for train.steps)
    model:        "Qwen/Qwen3-8B"               Hugging Face id or local checkpoint directory
    memory_model: "Qwen/Qwen3-1.7B"             DLC's memory network m_phi (needed when method.dlc_mu > 0)
    method:       calibrl.grid.Method(...).to_dict()
    seed:         0
    python:       interpreter of the command (optional, default: this one)
    train:        the paper's settings, keys as config ``grid.train``: steps, eval_every, prompts_per_step,
                  group_size, lr, max_new_tokens, max_prompt_len, temperature, top_p, kl_coef,
                  kl_estimator, clip_low, clip_high, dapo_clip_high, memory_lr (DLC); optional dapo_overlong_cache
                  (tokens; default 0.2 * max_new_tokens), weight_decay (0.01), grad_clip (1.0),
                  dapo_episode_factor (10), dlc_importance ("none"; calibrl.dlc.IMPORTANCE)
    data:         train (JSONL with the problem and answer fields), optional train_size (rows; counted
                  when absent), input_key ("problem"), label_key ("answer"), prompt_template
                  ("{problem}"), chat_template (bool), filtered_easiest (the filter_easiest share already
                  removed from ``train``; must equal the method's)
    paths:        ckpt_dir, log_dir, marker_dir; optional reward (default: this package's reward.py)
    resources:    actor_nodes, actor_gpus_per_node, ref_nodes, ref_gpus_per_node, vllm_engines,
                  vllm_tensor_parallel_size; optional vllm_gpu_memory_utilization (0.5), colocate_all
                  (False), zero_stage (2), micro_train_batch_size (4), micro_rollout_batch_size (8),
                  gradient_checkpointing (True), packing_samples (False), dynamic_batch (False: micro-batches
                  of max_tokens_per_gpu tokens, 16192, instead of a count; packs samples), ref_offload
                  (False), adam_offload (False), prefix_caching (True), keep_ds_checkpoints (2), extra_args
                  (list of further OpenRLHF flags); ``calibrl.layout.roles`` makes these from a run's layout

Flag names and defaults are OpenRLHF 0.11.2's (``openrlhf/cli/train_ppo_ray.py``; line numbers below are
of that file unless another is named). The ``--calibrl.*`` flags are read by ``launch.py`` and never reach
OpenRLHF.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import string
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

ESTIMATORS = {"grpo": "group_norm", "rloo": "rloo", "rpp": "reinforce_baseline", "drgrpo": "dr_grpo"}
"""calibrl estimator -> OpenRLHF ``--algo.advantage.estimator`` (choices at L514-522)."""

CALIBRL_FLAGS = (
    "iac_alpha",
    "dlc_mu",
    "dlc_memory",
    "dlc_memory_lr",
    "max_steps",
    "eval_every",
    "marker_dir",
    "loss_norm_len",
)
"""The launcher's own flags, each written ``--calibrl.<name> VALUE``."""


def build_command(run: dict) -> list[str]:
    """The full argv of ``python -m calibrl.train.openrlhf.launch`` for one (model, method, seed) run."""
    method, train, data = run["method"], run["train"], run["data"]
    paths, res = run["paths"], run["resources"]
    estimator = method["estimator"]
    if estimator not in ESTIMATORS:
        raise ValueError(f"method.estimator {estimator!r} has no OpenRLHF estimator; one of {sorted(ESTIMATORS)}")
    dapo, alpha, mu = bool(method["dapo"]), float(method["iac_alpha"]), float(method["dlc_mu"])
    if mu > 0 and not run.get("memory_model"):
        raise ValueError("method.dlc_mu > 0 (DLC) needs run['memory_model'], the memory network m_phi")
    if float(data.get("filtered_easiest", 0.0)) != float(method["filter_easiest"]):
        raise ValueError(
            f"method.filter_easiest is {method['filter_easiest']} but data.filtered_easiest is "
            f"{data.get('filtered_easiest', 0.0)}: the filtering baseline needs data.train with the easiest "
            "queries already removed (it is ranked by the initial policy, before training)"
        )

    # ---- steps. One rollout step takes B prompts x G samples; --train.batch_size B*G with one PPO epoch
    # (--train.max_epochs 1) makes that one optimizer step (DeepSpeed's train_batch_size), and OpenRLHF's
    # global_step counts rollout steps (ppo_trainer.py L264), so optimizer steps == global steps.
    # OpenRLHF has no max-steps flag: it runs --train.num_episodes passes over the first --data.max_samples
    # prompts of the file (ppo_trainer.py L39). With M = max_samples a multiple of B every step is full
    # (the loader takes B prompts per step, samples_generator.py L16-37), so an episode is M/B steps.
    # We take E = num_episodes as the smallest divisor of S = steps with S/E*B <= N (the prompts there
    # are) and M = S/E*B, hence E * M/B = S steps exactly. DeepScaleR (N ~ 40.3k), S=2000, B=64: E=1 and
    # E=2 would need 128000 and 64000 prompts, so E=4, M=32000, 4 x 500 steps = 2000 (the last ~8.3k
    # rows of the file are not used: shuffle the file once when it is made). The filtering baseline
    # (N ~ 30.2k) gets E=5, M=25600. --calibrl.max_steps S is a guard that stops at S whatever happens.
    steps, batch, group = int(train["steps"]), int(train["prompts_per_step"]), int(train["group_size"])
    size = data.get("train_size")
    if size is None:
        with open(data["train"], encoding="utf-8") as fh:
            size = sum(1 for line in fh if line.strip())
    size = int(size)
    episodes = next((e for e in range(1, steps + 1) if steps % e == 0 and steps // e * batch <= size), None)
    if episodes is None:
        raise ValueError(f"data.train has {size} prompts, fewer than one step's {batch}")
    max_samples = steps // episodes * batch
    if dapo:
        # DAPO's dynamic sampling drops groups whose samples all score the same and refills the batch
        # with new prompts (samples_generator.py L168-191), so a step consumes B / pass-rate prompts and
        # no flag can fix the step count. We give it dapo_episode_factor times the data (enough for a
        # pass rate down to 1/factor); the launcher's step limit stops at exactly S full steps and drops
        # the partial batch the end of each pass would leave.
        episodes *= int(train.get("dapo_episode_factor", 10))

    max_new = int(train["max_new_tokens"])
    loss_agg = "token-mean" if dapo else method.get("loss_agg", "seq-mean-token-mean")
    # 0.11.2 offers token-mean and seq-mean-token-mean (L440-447). Dr. GRPO's seq-mean-token-sum-norm (token
    # sums / (B * max_new_tokens)) is token-mean with the step's token count replaced by B * max_new_tokens:
    # loss_norm.py does that inside OpenRLHF (--calibrl.loss_norm_len, installed by the setup hook).
    norm_len = max_new if loss_agg == "seq-mean-token-sum-norm" else 0
    loss_agg = {"seq-mean-token-sum-norm": "token-mean"}.get(loss_agg, loss_agg)
    if loss_agg not in ("token-mean", "seq-mean-token-mean"):
        raise ValueError(f"method.loss_agg {loss_agg!r} has no OpenRLHF --actor.loss_agg_mode")

    reward = paths.get("reward") or str(Path(__file__).with_name("reward.py"))
    template = data.get("prompt_template", "{problem}")
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    if fields != ["problem"]:
        raise ValueError(f"data.prompt_template {template!r} must contain {{problem}} once and no other field")
    ckpt = Path(paths["ckpt_dir"])
    name = str(run.get("name") or "calibrl").replace("/", "_")

    def fmt(x) -> str:  # one spelling for every float
        return repr(float(x))

    argv = [run.get("python") or sys.executable, "-m", "calibrl.train.openrlhf.launch"]
    argv += ["--calibrl.iac_alpha", fmt(alpha), "--calibrl.dlc_mu", fmt(mu)]
    if mu > 0:
        argv += ["--calibrl.dlc_memory", str(run["memory_model"]), "--calibrl.dlc_memory_lr", fmt(train["memory_lr"])]
    stop_at = int(run.get("stop_at") or steps)
    if not 0 < stop_at <= steps or stop_at % int(train["eval_every"]) and stop_at != steps:
        raise ValueError(f"stop_at {stop_at} must be a checkpoint step (eval_every {train['eval_every']}) <= {steps}")
    argv += ["--calibrl.max_steps", str(stop_at), "--calibrl.eval_every", str(train["eval_every"])]
    argv += ["--calibrl.marker_dir", str(paths["marker_dir"])]
    if norm_len:
        argv += ["--calibrl.loss_norm_len", str(norm_len)]

    # ---- model, data, prompt
    argv += ["--actor.model_name_or_path", str(run["model"]), "--train.seed", str(int(run["seed"]))]
    argv += ["--data.prompt_dataset", str(data["train"]), "--data.prompt_split", "train"]
    argv += ["--data.input_key", data.get("input_key", "problem"), "--data.label_key", data.get("label_key", "answer")]
    if data.get("chat_template"):
        # The chat template wraps the raw field (datasets/prompts_dataset.py L27-37); --data.input_template
        # is ignored then, so an instruction must already be part of the field.
        if template != "{problem}":
            raise ValueError(
                "data.chat_template with a prompt_template: put the rendered prompt in a field of the JSONL and "
                "name it as data.input_key (OpenRLHF ignores input_template with a chat template)"
            )
        argv += ["--data.apply_chat_template"]
    elif template != "{problem}":
        # OpenRLHF fills the template with str.format(problem) (prompts_dataset.py L41): escape every brace
        # of the literal text (\boxed{} stays literal) and turn {problem} into {}.
        pieces = [
            lit.replace("{", "{{").replace("}", "}}") + ("{}" if f else "")
            for lit, f, _, _ in string.Formatter().parse(template)
        ]
        argv += ["--data.input_template", "".join(pieces)]
    argv += ["--data.max_samples", str(max_samples), "--train.num_episodes", str(episodes)]
    argv += ["--data.max_len", str(int(train["max_prompt_len"]) + max_new), "--rollout.max_new_tokens", str(max_new)]

    # ---- batch: B prompts (L392 counts prompts), G samples each, one optimizer step on all B*G samples
    argv += ["--rollout.batch_size", str(batch), "--rollout.n_samples_per_prompt", str(group)]
    argv += ["--train.batch_size", str(batch * group), "--train.max_epochs", "1"]
    argv += ["--rollout.temperature", fmt(train["temperature"]), "--rollout.top_p", fmt(train["top_p"])]
    argv += ["--rollout.micro_batch_size", str(res.get("micro_rollout_batch_size", 8))]
    argv += ["--train.micro_batch_size", str(res.get("micro_train_batch_size", 4))]

    # ---- optimizer (the paper: AdamW, lr 1e-6). OpenRLHF's defaults differ from verl's (L502-511:
    # betas 0.9/0.95, weight decay 0, cosine_with_min_lr with 3% warmup); set verl's: betas 0.9/0.999,
    # weight decay 0.01, constant lr without warmup, gradient clipping at 1.0.
    argv += ["--actor.adam.lr", fmt(train["lr"]), "--actor.adam.betas", "0.9", "0.999"]
    argv += ["--actor.adam.weight_decay", fmt(train.get("weight_decay", 0.01))]
    argv += ["--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0.0"]
    argv += ["--actor.max_norm", fmt(train.get("grad_clip", 1.0))]

    # ---- algorithm
    argv += ["--algo.advantage.estimator", ESTIMATORS[estimator], "--actor.loss_agg_mode", loss_agg]
    # OpenRLHF clips every group advantage to --reward.clip_range before spreading it over the tokens
    # (models/utils.py L141-142, default -10..10, L474); verl does not. IAC's calibrated advantages exceed
    # 10 (G=8, one success: 2.47 * 7^alpha = 17.3 at alpha=1), so the clip is opened for every method
    # (plain advantages stay below 2.5). Integers: argparse takes "-1e6" for an option, "-1000000" not.
    argv += ["--reward.clip_range", "-1000000", "1000000"]
    argv += ["--reward.remote_url", reward]  # a .py file is loaded as reward_func (utils/agent.py L196-205)
    argv += ["--actor.entropy_coef", "0"]  # 0: no entropy loss, but the policy entropy is logged (Figure 6)
    if dapo:
        # DAPO as verl's recipe (recipe/dapo/run_dapo_qwen2.5_32b.sh; notes section 5), with the paper's
        # lr, batch and G and no warmup or weight-decay change (those are optimizer settings, not DAPO):
        #   clip_ratio_low 0.2 / clip_ratio_high 0.28 (clip-higher) -> --actor.eps_clip_low_high 0.2 0.28
        #   clip_ratio_c 10 (dual clip)                             -> --actor.dual_clip 10
        #   loss_agg_mode token-mean                                -> --actor.loss_agg_mode token-mean (above)
        #   use_kl_loss False, use_kl_in_reward False               -> --algo.kl.init_coef 0 (no reference model)
        #   filter_groups.enable, metric acc                        -> --algo.dynamic_filtering_enable, keep a group
        #       iff 0 < mean score < 1 (samples_generator.py L169-177; scores are reward.py's 0/1 correctness)
        #   overlong_buffer.len 4096 of 20480, penalty_factor 1.0   -> --reward.overlong_buffer_len (0.2 of
        #       --rollout.max_new_tokens unless dapo_overlong_cache is set), --reward.overlong_penalty_factor 1
        #   adv_estimator grpo, temperature 1, top_p 1             -> group_norm; rollout settings above
        #   max_num_gen_batches 10: OpenRLHF refills until the data runs out (no cap)
        buffer = int(train.get("dapo_overlong_cache") or round(0.2 * max_new))
        argv += ["--actor.eps_clip_low_high", fmt(train["clip_low"]), fmt(train["dapo_clip_high"])]
        argv += ["--actor.dual_clip", "10.0", "--algo.kl.init_coef", "0.0"]
        argv += ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.0", "1.0"]
        argv += ["--reward.overlong_buffer_len", str(buffer), "--reward.overlong_penalty_factor", "1.0"]
    else:
        # verl's PPO loss: clip_ratio 0.2 both ways and dual clip clip_ratio_c 3.0 (verl actor defaults).
        # KL: one setting for every baseline, as the paper runs all of them "in the same setting", and as
        # calibrl's local trainer does: verl's GRPO recipe, KL as a loss (use_kl_loss, kl_loss_coef 1e-3,
        # low_var_kl = k3) -> --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 1e-3. (verl's
        # RLOO and REINFORCE++ examples put a k1 KL in the reward instead, its Dr. GRPO example has none.)
        argv += ["--actor.eps_clip_low_high", fmt(train["clip_low"]), fmt(train["clip_high"])]
        argv += ["--actor.dual_clip", "3.0", "--algo.kl.init_coef", fmt(train["kl_coef"])]
        if float(train["kl_coef"]) > 0:
            argv += ["--algo.kl.use_loss", "--algo.kl.estimator", str(train["kl_estimator"])]

    if mu > 0:
        # DLC samples from softmax(f_theta - mu f_phi), not pi_theta. grid.train.dlc_importance "none" (default,
        # Algorithm 1 line 20 as written): no correction, OpenRLHF's is_correction stays off and its PPO ratio is
        # against pi_theta_old recomputed by the actor. "truncated": clamp(pi_theta_old / pi_sample, 0.5, 5) per
        # token (calibrl.dlc.importance_weights, as the local trainer), OpenRLHF's token/clip IS correction, whose
        # rollout logprobs are the composite engine's (processed_logprobs).
        from calibrl.dlc import IMPORTANCE, IMPORTANCE_BOUNDS

        importance = train.get("dlc_importance", "none")
        if importance not in IMPORTANCE:
            raise ValueError(f"grid.train.dlc_importance must be one of {IMPORTANCE}, got {importance!r}")
        if importance == "truncated":
            argv += ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip"]
            argv += ["--algo.advantage.is_correction_threshold", *(fmt(b) for b in IMPORTANCE_BOUNDS)]

    # ---- checkpoints: DeepSpeed state for resuming (rotated, keep_ds_checkpoints kept) and a Hugging Face
    # copy at every eval_every steps, {ckpt_dir}/global_step{k}_hf (ppo_trainer.py L394-398, ppo_actor.py
    # L675-681), never rotated; --ckpt.load_enable resumes from {ckpt_dir}/_actor when it exists.
    argv += ["--ckpt.path", str(ckpt), "--ckpt.save_steps", str(train["eval_every"]), "--ckpt.save_hf"]
    argv += ["--ckpt.load_enable", "--ckpt.max_num", str(res.get("keep_ds_checkpoints", 2))]
    argv += ["--ckpt.output_dir", str(ckpt / "final"), "--ckpt.best_metric_key", "none"]
    argv += ["--logger.tensorboard_dir", str(paths["log_dir"]), "--logger.wandb.run_name", name]
    argv += ["--logger.logging_steps", "1"]

    # ---- placement: actor (DeepSpeed), reference (only built when a KL is used, L93), vLLM engines
    argv += ["--actor.num_nodes", str(res["actor_nodes"]), "--actor.num_gpus_per_node", str(res["actor_gpus_per_node"])]
    argv += ["--ref.num_nodes", str(res["ref_nodes"]), "--ref.num_gpus_per_node", str(res["ref_gpus_per_node"])]
    argv += ["--vllm.num_engines", str(res["vllm_engines"])]
    argv += ["--vllm.tensor_parallel_size", str(res["vllm_tensor_parallel_size"])]
    argv += ["--vllm.gpu_memory_utilization", fmt(res.get("vllm_gpu_memory_utilization", 0.5))]
    if res.get("prefix_caching", True):
        argv += ["--vllm.enable_prefix_caching"]  # the G samples of a prompt share its prefix
    if res.get("colocate_all", False):
        argv += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    argv += ["--ds.zero_stage", str(res.get("zero_stage", 2))]
    if res.get("gradient_checkpointing", True):
        argv += ["--actor.gradient_checkpointing_enable"]
    if res.get("packing_samples", False) or res.get("dynamic_batch", False):
        argv += ["--ds.packing_samples"]  # no padding tokens; needs flash-attn (the cluster env has its wheel)
    if res.get("dynamic_batch", False):
        # micro-batches of at most N tokens (one sequence is up to max_prompt_len + max_new_tokens): the memory of
        # a forward is bounded by N, not by the count of samples times the longest (L376-380, L690-697)
        tokens = str(int(res.get("max_tokens_per_gpu", 16192)))
        argv += ["--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", tokens]
        argv += ["--rollout.max_tokens_per_gpu", tokens]
    if res.get("ref_offload", False):
        argv += ["--ref.offload"]  # the frozen reference in CPU memory between its forwards
    if res.get("adam_offload", False):
        argv += ["--ds.adam_offload"]
    argv += [str(a) for a in res.get("extra_args", [])]
    return argv


def split_calibrl(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Separate the ``--calibrl.NAME VALUE`` (or ``--calibrl.NAME=VALUE``) flags from OpenRLHF's argv."""
    ours: dict[str, str] = {}
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if not arg.startswith("--calibrl."):
            rest.append(arg)
            continue
        key, eq, value = arg[len("--calibrl.") :].partition("=")
        if key not in CALIBRL_FLAGS:
            raise ValueError(f"unknown launcher flag --calibrl.{key}; known: {', '.join(CALIBRL_FLAGS)}")
        if not eq:
            value = next(it, None)
            if value is None:
                raise ValueError(f"--calibrl.{key} needs a value")
        ours[key] = value
    return ours, rest


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
