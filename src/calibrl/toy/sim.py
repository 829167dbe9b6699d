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
step updates all seeds at once (SGD, momentum and AdamW are elementwise, so seeds never mix).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch

from calibrl.algo.advantages import advantages
from calibrl.algo.dlc import calibrated_logits, memory_loss

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
    """One configuration of the toy. The defaults are those of ``calibrl toy`` by hand (its ``--help``; no IAC, no
    DLC, no held-out query); the workflow sets every field from the config's ``toy`` section
    (``calibrl.toy.figures``)."""

    estimator: str = "raw"
    group_size: int = 8
    optimizer: str = "sgd"
    lr: float = 0.5
    steps: int = 500
    seeds: int = 256
    seed: int = 0
    init: str = "zero"
    iac_alpha: float = 0.0
    dlc_mu: float = 0.0
    memory_lr: float = 0.5
    momentum: float = 0.9
    weight_decay: float = 0.01
    siamese: str | None = None
    record_every: int = 5

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


def _initial_weights(setting: ToySetting, gen: torch.Generator) -> torch.Tensor:
    """W of shape (seeds, labels, dims).

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
        return 0.1 * torch.randn(n, k, 4, generator=gen, dtype=torch.float64)
    siam = SIAMESE_QUERIES[setting.siamese or "high"]
    queries = torch.tensor([EMBEDDINGS["persian"], siam], dtype=torch.float64).T  # (dims, 2)
    targets = torch.tensor([[0.4, 0.1, 0.4, 0.1], [0.4, 0.1, 0.1, 0.4]], dtype=torch.float64).T.log()
    w = targets @ torch.linalg.pinv(queries)  # (labels, dims), W @ e_q = log target
    return w.expand(n, k, 4).clone()


def _optimizer(setting: ToySetting, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    if setting.optimizer == "sgd":
        return torch.optim.SGD(params, lr=setting.lr)
    if setting.optimizer == "momentum":
        return torch.optim.SGD(params, lr=setting.lr, momentum=setting.momentum)
    return torch.optim.AdamW(params, lr=setting.lr, weight_decay=setting.weight_decay)


def run(setting: ToySetting) -> pd.DataFrame:
    """Simulate every seed of ``setting``; one row per (seed, recorded step), probabilities as columns.

    The result is a function of ``(setting.seed, setting.seeds)`` and the other fields: the same
    setting always gives the same frame.
    """
    gen = torch.Generator().manual_seed(setting.seed)
    e_q = torch.tensor(EMBEDDINGS["persian"], dtype=torch.float64)
    e_held = torch.tensor(SIAMESE_QUERIES[setting.siamese], dtype=torch.float64) if setting.siamese else None
    w = _initial_weights(setting, gen).requires_grad_(True)
    opt = _optimizer(setting, [w])
    use_dlc = setting.dlc_mu > 0
    if use_dlc:  # the memory network starts uniform: no calibration until it has seen samples
        m = torch.zeros_like(w, requires_grad=True)
        mem_opt = torch.optim.SGD([m], lr=setting.memory_lr)
    correct = torch.zeros(len(LABELS), dtype=torch.float64)
    correct[list(CORRECT_FOR_PERSIAN)] = 1.0

    records: list[np.ndarray] = []
    steps_seen: list[int] = []

    def record(step: int) -> None:
        with torch.no_grad():
            cols = [torch.softmax(w @ e_q, dim=-1)]
            if e_held is not None:
                cols.append(torch.softmax(w @ e_held, dim=-1)[:, 3:4])
            records.append(torch.cat(cols, dim=-1).numpy().copy())
        steps_seen.append(step)

    record(0)
    for step in range(1, setting.steps + 1):
        logits = w @ e_q  # (seeds, labels)
        with torch.no_grad():
            sample_logits = calibrated_logits(logits, m @ e_q, setting.dlc_mu) if use_dlc else logits
            sampled = torch.multinomial(
                torch.softmax(sample_logits, -1), setting.group_size, replacement=True, generator=gen
            )  # (seeds, G)
            rewards = correct[sampled]
            adv = advantages(rewards.unsqueeze(1), setting.estimator, setting.iac_alpha).squeeze(1)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, sampled)
        loss = -(adv * logp).mean(dim=-1).sum()  # sum over seeds: each seed gets its own gradient
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        if use_dlc:  # Algorithm 1 lines 21-22: fit the memory to this step's samples
            mem_logits = (m @ e_q).unsqueeze(1).expand(-1, setting.group_size, -1)
            mloss = memory_loss(mem_logits.reshape(-1, len(LABELS)), sampled.reshape(-1))
            mem_opt.zero_grad(set_to_none=False)
            (mloss * setting.seeds).backward()  # undo the mean over seeds
            mem_opt.step()
        if step % setting.record_every == 0 or step == setting.steps:
            record(step)

    probs = np.stack(records, axis=1)  # (seeds, records, cols)
    columns = [f"p_{name}" for name in LABELS] + (["p_siamese_heldout"] if e_held is not None else [])
    n_seeds, n_rec, _ = probs.shape
    frame = pd.DataFrame(probs.reshape(n_seeds * n_rec, -1), columns=columns)
    frame.insert(0, "step", np.tile(np.asarray(steps_seen), n_seeds))
    frame.insert(0, "seed", np.repeat(np.arange(n_seeds), n_rec))
    return frame
