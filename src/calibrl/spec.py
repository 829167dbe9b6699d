"""What a run trains with, typed: its method compiled once, and the settings shared by every method.

A method in the config is a bundle of switches (``grid.methods.<name>``: estimator, IAC's alpha, DLC's mu,
DAPO, the filtering share, the control's shuffled rewards, the loss aggregation). :func:`compile_method` turns it,
with ``grid.train``, into a :class:`MethodSpec` that holds every consequence of those switches (DAPO: no KL,
clip-higher, dual clip 10, token-mean, a +1 / -1 reward with overlong shaping, dynamic sampling; DLC: the memory's
learning rate): the one place a switch is interpreted. The spec goes into the run's ``settings.json``, which both
backends read rather than re-derive a switch from the raw config. Defaults live in the config schema
(``calibrl.config``): these classes take complete dicts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class MethodSpec:
    """One method as a trainer applies it."""

    name: str
    estimator: str  # calibrl.algo.advantages.ESTIMATORS
    iac_alpha: float  # 0: no IAC
    dlc_mu: float  # 0: no DLC
    dapo: bool
    filter_easiest: float  # Table 5's filtering baseline: the easiest share of queries dropped (0: none)
    shuffle_rewards: bool  # the control arm: each step's rewards permuted across its responses (calibrl.algo.control)
    loss_agg: str  # calibrl.algo.losses.AGGREGATIONS
    kl_coef: float  # 0: no KL term and no reference model
    kl_estimator: str  # calibrl.algo.losses.KL_ESTIMATORS
    clip_low: float
    clip_high: float
    dual_clip: float
    reward: str  # calibrl.algo.dapo.REWARDS: "binary" (1 correct / 0 wrong) or "signed" (DAPO: +1 / -1)
    overlong_cache: int | None  # DAPO's overlong buffer in tokens; None: no shaping
    dynamic_sampling: bool  # DAPO's filter of groups without signal
    max_gen_batches: int | None  # DAPO: generation batches per step at most (CPU trainer)
    filter_samples: int | None  # filtering baseline: samples per query to rank them
    memory_lr: float | None  # DLC: the memory network's learning rate
    dlc_importance: str | None  # DLC: calibrl.algo.dlc.IMPORTANCE

    @property
    def uses_kl(self) -> bool:
        """A KL term to a reference model is in the loss (and the reference model is built)."""
        return self.kl_coef > 0

    @property
    def uses_dlc(self) -> bool:
        return self.dlc_mu > 0

    @property
    def uses_iac(self) -> bool:
        return self.iac_alpha > 0

    @property
    def filters(self) -> bool:
        return self.filter_easiest > 0

    def to_dict(self) -> dict:
        """The spec as settings.json and a run's identity hold it: a switch added after runs were made is left out
        where it is off (:data:`LATER_SWITCHES`), so a new version does not retrain the runs that do not use it."""
        return {k: v for k, v in _flat_dict(self).items() if k not in LATER_SWITCHES or v != LATER_SWITCHES[k]}

    @classmethod
    def from_dict(cls, data: dict) -> MethodSpec:
        data = {**LATER_SWITCHES, **data}
        return cls(**{f.name: data[f.name] for f in fields(cls)})


# Switches added to MethodSpec after a release, with the value that means "off" (what every earlier run did).
LATER_SWITCHES = {"shuffle_rewards": False}


def _flat_dict(spec) -> dict:
    """``dataclasses.asdict`` of a dataclass whose fields are all scalars (as every class here), without its deep
    copy of each value: the workflow puts a run's spec and settings into the params of its jobs while it plans them."""
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def compile_method(name: str, switches: dict, train: dict) -> MethodSpec:
    """The spec of method ``name`` (``switches``: ``grid.methods.<name>``, ``train``: ``grid.train``, both with
    the schema's defaults filled in). Refuses names no registry knows, with the choices."""
    # the registries where a method is compiled (they import no torch: calibrl.algo); a Ray worker's setup hook
    # reads specs without them (calibrl.backends.openrlhf.hook)
    from calibrl.algo.advantages import ESTIMATORS
    from calibrl.algo.dlc import IMPORTANCE
    from calibrl.algo.losses import AGGREGATIONS, KL_ESTIMATORS

    estimator, loss_agg, kl = switches["estimator"], switches["loss_agg"], train["kl_estimator"]
    for registry, value in ((ESTIMATORS, estimator), (AGGREGATIONS, loss_agg), (KL_ESTIMATORS, kl)):
        registry[value]  # raises with the registered names
    alpha, mu = float(switches["iac_alpha"]), float(switches["dlc_mu"])
    if alpha < 0 or mu < 0:
        raise ValueError(f"method {name!r}: iac_alpha and dlc_mu must be >= 0, got {alpha}, {mu}")
    dapo, share = bool(switches["dapo"]), float(switches["filter_easiest"])
    if mu > 0 and train["dlc_importance"] not in IMPORTANCE:
        raise ValueError(f"grid.train.dlc_importance must be one of {IMPORTANCE}, got {train['dlc_importance']!r}")
    return MethodSpec(
        name=name,
        estimator=estimator,
        iac_alpha=alpha,
        dlc_mu=mu,
        dapo=dapo,
        filter_easiest=share,
        shuffle_rewards=bool(switches["shuffle_rewards"]),
        # DAPO (Yu et al., 2025; verl's recipe): token-mean, no KL, clip-higher, dual clip 10, the signed reward
        # with overlong shaping, dynamic sampling
        loss_agg="token-mean" if dapo else loss_agg,
        kl_coef=0.0 if dapo else float(train["kl_coef"]),
        kl_estimator=kl,
        clip_low=float(train["clip_low"]),
        clip_high=float(train["dapo_clip_high"] if dapo else train["clip_high"]),
        dual_clip=float(train["dapo_dual_clip"] if dapo else train["dual_clip"]),
        # DAPO's reward is +1 / -1 (verl's math_dapo.compute_score), the others' 1 / 0 (calibrl.algo.dapo)
        reward="signed" if dapo else "binary",
        overlong_cache=int(train["dapo_overlong_cache"]) if dapo else None,
        dynamic_sampling=dapo,
        max_gen_batches=int(train["dapo_max_gen_batches"]) if dapo else None,
        filter_samples=int(train["filter_samples"]) if share > 0 else None,
        memory_lr=float(train["memory_lr"]) if mu > 0 else None,
        dlc_importance=str(train["dlc_importance"]) if mu > 0 else None,
    )


@dataclass(frozen=True)
class TrainSettings:
    """The optimisation settings every method of a grid shares (``grid.train``, less what :func:`compile_method`
    folds into each method's spec)."""

    steps: int
    eval_every: int
    prompts_per_step: int
    group_size: int
    lr: float
    weight_decay: float
    weight_decay_scope: str  # all / no_bias_norm (calibrl.optim.decay_groups)
    grad_clip: float
    ppo_minibatches: int
    max_new_tokens: int
    max_prompt_len: int
    temperature: float
    top_p: float

    @classmethod
    def from_config(cls, train: dict) -> TrainSettings:
        """From ``grid.train`` (defaults filled in) or a run's ``settings.json`` ``train``."""
        return cls(**{f.name: train[f.name] for f in fields(cls)})

    def to_dict(self) -> dict:
        return _flat_dict(self)


@dataclass(frozen=True)
class EvalSettings:
    """How a checkpoint is evaluated (``grid.eval``, the prompt and the sampling seed), the same for every run so
    that runs are compared on the same samples."""

    n: int
    k: int
    temperature: float
    top_p: float
    top_k: int  # 0: every token
    max_new_tokens: int
    max_prompt_len: int
    template: str
    chat_template: bool
    enable_thinking: bool  # Qwen3's thinking mode, through its chat template
    seed: int
    evaluator: str
    dtype: str  # evaluator vllm: the engine's dtype (vLLM on CPU: float32)
    enforce_eager: bool  # evaluator vllm: no CUDA graphs (faster start, slower decode)
    tensor_parallel_size: int  # evaluator vllm: GPUs per engine
    data_parallel_size: int  # evaluator vllm: engines per job

    @classmethod
    def from_params(cls, params: dict) -> EvalSettings:
        return cls(**{f.name: params[f.name] for f in fields(cls)})

    def for_seed(self, run_seed: int) -> EvalSettings:
        """The sampling stream of training seed ``run_seed``: the same for every arm at that seed (common random
        numbers) and independent across seeds, so evaluation noise replicates with the seed (``calibrl.stats``)."""
        digest = hashlib.sha256(f"{self.seed}/{run_seed}".encode()).digest()
        return replace(self, seed=int.from_bytes(digest[:4], "little"))

    def to_dict(self) -> dict:
        return _flat_dict(self)
