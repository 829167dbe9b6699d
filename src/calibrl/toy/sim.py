"""The controlled softmax experiment of Section 2.4 (and Appendices G, H), vectorised over seeds.

A linear softmax policy ``pi(o|q) = softmax(W e_q)`` over the labels Cat, Dog, Persian, Siamese
(no bias, so the kernel between queries is ``e_q . e_q'`` as in Appendix G). Only the Persian query
is trained: each step samples a group of G labels, rewards Cat and Persian with 1, turns rewards
into advantages with the shared estimators (optionally IAC), and takes one optimizer step on the
policy-gradient loss ``-(1/G) sum_s A_s log pi(o_s|q)`` (the sampled part of Equation 3).
With DLC the group is drawn from ``softmax(f_theta - mu f_phi)`` and a linear memory network is then
fitted to the sampled labels with cross-entropy (Algorithm 1). A held-out Siamese query, at the
High / Mid / Low embeddings of Section 2.4, is only observed.

Every seed is an independent copy of the model; the seed axis leads every tensor, so one optimizer
step updates all seeds at once (SGD, momentum and AdamW are elementwise, so seeds never mix). Settings that
share a group size, horizon and seed count are simulated together on that axis (``simulate``: a figure's
configurations at every learning rate of its range in a few calls), paired by seed: seed i of every setting
samples with the same uniforms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch

from calibrl.algo.advantages import advantages
from calibrl.algo.dlc import calibrated_logits

LABELS = ("cat", "dog", "persian", "siamese")
CORRECT_FOR_PERSIAN = (0, 2)  # Cat (superclass) and Persian (subclass) earn reward 1

EMBEDDINGS = {  # Section 2.4
    "cat": (0.5, 0.5, 0.5, 0.1),
    "persian": (0.75, 0.5, 0.25, 0.1),
    "dog": (0.1, 0.1, 0.1, 0.9),
    "siamese": (0.25, 0.5, 0.75, 0.1),
}
SIAMESE_QUERIES = {  # held-out query embeddings, Section 2.4 and Appendix G
    "high": (0.25, 0.5, 0.75, 0.1),
    "mid": (0.1, 0.5, 0.9, 0.1),
    "low": (0.0, 0.5, 1.0, 0.1),
}
OPTIMIZERS = ("sgd", "momentum", "adamw")
INITS = ("zero", "random", "warm")


@dataclass(frozen=True)
class ToySetting:
    """One configuration of the toy. Every value the config's ``toy`` section holds is given (``calibrl.toy.figures.
    toy_setting``: the section, with the schema's defaults, and a figure's or ``calibrl toy``'s overrides); the rest
    default to the plain configuration: G = 8, SGD, no IAC, no DLC, no held-out query."""

    estimator: str
    lr: float
    steps: int
    seeds: int
    seed: int
    init: str
    memory_lr: float
    momentum: float
    weight_decay: float
    record_every: int
    group_size: int = 8
    optimizer: str = "sgd"
    iac_alpha: float = 0.0
    dlc_mu: float = 0.0
    siamese: str | None = None

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if self.siamese is not None and self.siamese not in SIAMESE_QUERIES:
            raise ValueError(f"siamese must be one of {tuple(SIAMESE_QUERIES)}, got {self.siamese!r}")
        for name in ("group_size", "steps", "seeds", "record_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.memory_lr <= 0:
            raise ValueError("learning rates must be > 0")
        if self.iac_alpha < 0 or self.dlc_mu < 0:
            raise ValueError("iac_alpha and dlc_mu must be >= 0")

    def params(self) -> dict:
        return asdict(self)


def _initial_weights(setting: ToySetting, noise: torch.Tensor) -> torch.Tensor:
    """W of shape (seeds, labels, dims); ``noise`` is the N(0, 1) draw of shape (seeds, labels, dims) that every
    setting takes from its generator first, whatever its init (so the sampling stream that follows is the same).

    ``zero``: the uniform policy, Cat and Persian exactly tied, so which one wins is decided by
    sampling noise alone (the paper's "which label wins is random"). ``random``: N(0, 0.1^2)
    entries per seed. ``warm``: the minimum-norm W whose Persian query gives (Cat, Dog, Persian,
    Siamese) = (.4, .1, .4, .1) and whose Siamese query gives (.4, .1, .1, .4), a reference that
    already covers both correct modes, as an SFT model would.
    """
    n, k = setting.seeds, len(LABELS)
    if setting.init == "zero":
        return torch.zeros(n, k, 4, dtype=torch.float64)
    if setting.init == "random":
        return 0.1 * noise.clone()
    siam = SIAMESE_QUERIES[setting.siamese or "high"]
    queries = torch.tensor([EMBEDDINGS["persian"], siam], dtype=torch.float64).T  # (dims, 2)
    targets = torch.tensor([[0.4, 0.1, 0.4, 0.1], [0.4, 0.1, 0.1, 0.4]], dtype=torch.float64).T.log()
    w = targets @ torch.linalg.pinv(queries)  # (labels, dims), W @ e_q = log target
    return w.expand(n, k, 4).clone()


SHARED = ("group_size", "steps", "seeds", "seed", "record_every")
"""Fields that settings simulated together (``simulate``) must share: they fix the shapes and the random stream."""


def _rows(settings: list[ToySetting], values: list[float]) -> torch.Tensor:
    """One value per setting, repeated for each of its seeds: shape (settings * seeds,)."""
    return torch.tensor(values, dtype=torch.float64).repeat_interleave(settings[0].seeds)


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, written out: ``torch.softmax`` is several times slower over 4 labels."""
    e = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum(dim=-1, keepdim=True)


def policy_grad(pi: torch.Tensor, sampled: torch.Tensor, adv: torch.Tensor, e_q: torch.Tensor) -> torch.Tensor:
    """Gradient in W (rows, labels, dims) of the sampled policy-gradient loss ``-(1/G) sum_s A_s log pi(o_s|q)``
    of ``pi = softmax(W e_q)`` (rows, labels), ``sampled``/``adv`` (rows, G): in the logits it is
    ``-(1/G) (sum_s A_s e_{o_s} - (sum_s A_s) pi)``, times ``e_q``."""
    weighted = torch.zeros_like(pi).scatter_add_(1, sampled, adv)
    return (-(weighted - adv.sum(dim=-1, keepdim=True) * pi) / sampled.shape[-1]).unsqueeze(-1) * e_q


def memory_grad(mem_logits: torch.Tensor, sampled: torch.Tensor, e_q: torch.Tensor) -> torch.Tensor:
    """Gradient in M (rows, labels, dims) of the memory's cross-entropy on one step's samples, the mean over the G
    samples of each row: ``(softmax(M e_q) - counts / G) e_q^T``. Written out because autograd through
    ``calibrl.algo.dlc.memory_loss`` costs 25 times as much here; tests/test_toy.py checks that the two agree."""
    counts = torch.zeros_like(mem_logits).scatter_add_(1, sampled, torch.ones_like(sampled, dtype=mem_logits.dtype))
    return (_softmax(mem_logits) - counts / sampled.shape[-1]).unsqueeze(-1) * e_q


class _Optimizer:
    """SGD, heavy-ball momentum and AdamW, per row (each setting's seeds), as ``torch.optim`` computes them:
    momentum ``b = beta b + g, w -= lr b`` (SGD: beta 0); AdamW ``w *= 1 - lr wd`` then the bias-corrected Adam
    step with betas (0.9, 0.999) and eps 1e-8."""

    BETAS, EPS = (0.9, 0.999), 1e-8

    def __init__(self, settings: list[ToySetting], w: torch.Tensor) -> None:
        def rows(values):
            return _rows(settings, values).view(-1, 1, 1)

        self.lr = rows([s.lr for s in settings])
        self.beta = rows([s.momentum if s.optimizer == "momentum" else 0.0 for s in settings])
        self.decay = 1 - self.lr * rows([s.weight_decay if s.optimizer == "adamw" else 0.0 for s in settings])
        self.adam = rows([float(s.optimizer == "adamw") for s in settings]) > 0
        self.any_adam = any(s.optimizer == "adamw" for s in settings)
        self.any_sgd = any(s.optimizer != "adamw" for s in settings)
        self.any_momentum = any(s.optimizer == "momentum" for s in settings)
        self.buf, self.exp_avg, self.exp_avg_sq = (torch.zeros_like(w) for _ in range(3))

    def step(self, w: torch.Tensor, grad: torch.Tensor, step: int) -> torch.Tensor:
        """Update ``w`` in place (update number ``step``, 1-based, with gradient ``grad``) and return it."""
        if not self.any_adam:
            self.buf = self.buf.mul_(self.beta).add_(grad) if self.any_momentum else grad
            return w.addcmul_(self.lr, self.buf, value=-1)
        (b1, b2), eps = self.BETAS, self.EPS
        self.exp_avg.mul_(b1).add_(grad, alpha=1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = self.exp_avg_sq.sqrt().div_((1 - b2**step) ** 0.5).add_(eps)
        adamw = (w * self.decay).addcdiv_(self.exp_avg * (self.lr / (1 - b1**step)), denom, value=-1)
        if not self.any_sgd:
            return w.copy_(adamw)
        self.buf = self.buf.mul_(self.beta).add_(grad) if self.any_momentum else grad
        return w.copy_(torch.where(self.adam, adamw, w.addcmul(self.lr, self.buf, value=-1)))


def simulate(settings: list[ToySetting]) -> list[pd.DataFrame]:
    """Simulate several settings at once, one frame per setting, each exactly what ``run`` gives for it alone.

    The settings must agree on ``SHARED``; everything else (estimator, optimizer, learning rate, IAC, DLC,
    held-out query, init) may differ. Their seeds are stacked on the leading axis. Every step draws one set of
    uniforms of shape (seeds, G) and every setting samples its group by inverting its own CDF at them, so seed
    i of every setting sees the same random numbers (common random numbers: the settings are paired by seed).
    The optimizers are written out (SGD, heavy-ball momentum and AdamW exactly as ``torch.optim`` computes
    them, elementwise, so a seed never sees another), and the gradient of the sampled policy-gradient loss of
    the linear softmax is explicit: ``d/dz [-(1/G) sum_s A_s log pi(o_s)] = -(1/G) (sum_s A_s e_{o_s} - (sum_s
    A_s) pi)``, times ``e_q`` for W; the memory's cross-entropy gradient is ``softmax(M e_q) - counts / G``.
    """
    settings = list(settings)
    if not settings:
        return []
    first = settings[0]
    for s in settings[1:]:
        differ = [f for f in SHARED if getattr(s, f) != getattr(first, f)]
        if differ:
            raise ValueError(f"settings simulated together must share {SHARED}; these differ: {differ}")
    n, g, k, n_set = first.seeds, first.group_size, len(LABELS), len(settings)
    gen = torch.Generator().manual_seed(first.seed)
    noise = torch.randn(n, k, 4, generator=gen, dtype=torch.float64)
    w = torch.cat([_initial_weights(s, noise) for s in settings])  # (rows, labels, dims)
    e_q = torch.tensor(EMBEDDINGS["persian"], dtype=torch.float64)
    held = [s.siamese is not None for s in settings]
    e_held = torch.cat(
        [torch.tensor(SIAMESE_QUERIES[s.siamese or "high"], dtype=torch.float64).expand(n, 4) for s in settings]
    )

    opt = _Optimizer(settings, w)
    mu = _rows(settings, [s.dlc_mu for s in settings]).view(-1, 1)
    use_dlc = any(s.dlc_mu > 0 for s in settings)
    mem = torch.zeros_like(w)  # the memory network starts uniform: no calibration until it has seen samples
    mem_lr = _rows(settings, [s.memory_lr for s in settings]).view(-1, 1, 1)
    groups: dict[tuple[str, float], list[int]] = {}
    for i, s in enumerate(settings):
        groups.setdefault((s.estimator, s.iac_alpha), []).extend(range(i * n, (i + 1) * n))
    index = {key: torch.tensor(rows) for key, rows in groups.items()}
    correct = torch.zeros(k, dtype=torch.float64)
    correct[list(CORRECT_FOR_PERSIAN)] = 1.0

    records: list[np.ndarray] = []
    steps_seen: list[int] = []

    def record(step: int) -> None:
        p = _softmax(w @ e_q)
        p_held = _softmax(torch.einsum("bkd,bd->bk", w, e_held))[:, 3:4]
        records.append(torch.cat([p, p_held], dim=-1).numpy().copy())
        steps_seen.append(step)

    record(0)
    for step in range(1, first.steps + 1):
        logits = w @ e_q  # (rows, labels)
        pi = _softmax(logits)
        # Algorithm 1 line 5, f_theta - mu f_phi, with each row's mu folded into its memory logits
        sample = _softmax(calibrated_logits(logits, mu * (mem @ e_q), 1.0)) if use_dlc else pi
        u = torch.rand(n, g, generator=gen, dtype=torch.float64).repeat(n_set, 1)
        # the label whose CDF interval holds u: how many of the first k - 1 CDF values are <= u (rows, G)
        cdf = sample.cumsum(dim=-1)
        sampled = (u >= cdf[:, :1]).long()
        for j in range(1, k - 1):
            sampled += u >= cdf[:, j : j + 1]
        rewards = correct[sampled]
        if len(index) == 1:
            ((est, alpha),) = index
            adv = advantages(rewards.unsqueeze(1), est, alpha).squeeze(1)
        else:
            adv = torch.empty_like(rewards)
            for (est, alpha), rows in index.items():
                adv[rows] = advantages(rewards[rows].unsqueeze(1), est, alpha).squeeze(1)
        grad = policy_grad(pi, sampled, adv, e_q)
        w = opt.step(w, grad, step)
        if use_dlc:  # Algorithm 1 lines 21-22: fit the memory to this step's samples (cross-entropy, SGD)
            mem = mem - mem_lr * memory_grad(mem @ e_q, sampled, e_q)
        if step % first.record_every == 0 or step == first.steps:
            record(step)

    probs = np.stack(records, axis=1)  # (rows, records, labels + 1)
    steps = np.asarray(steps_seen)
    columns = [f"p_{name}" for name in LABELS]
    frames = []
    for i, with_held in enumerate(held):
        block = probs[i * n : (i + 1) * n]
        cols = columns + (["p_siamese_heldout"] if with_held else [])
        frame = pd.DataFrame(block[..., : len(cols)].reshape(n * len(steps), -1), columns=cols)
        frame.insert(0, "step", np.tile(steps, n))
        frame.insert(0, "seed", np.repeat(np.arange(n), len(steps)))
        frames.append(frame)
    return frames


def run(setting: ToySetting) -> pd.DataFrame:
    """Simulate every seed of ``setting``; one row per (seed, recorded step), probabilities as columns.

    The result is a function of ``(setting.seed, setting.seeds)`` and the other fields: the same
    setting always gives the same frame, alone or simulated with others (``simulate``).
    """
    return simulate([setting])[0]
