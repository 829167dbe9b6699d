"""The pre-registered analysis plan: the primary claims, their quantities, test, margins and replication, in one
YAML file (``grid.claims.plan``) fixed before the data that decide it.

**Seeds drawn from the plan itself.** The plan does not list the seeds that decide it: it gives how many data seeds
(each its own problems and its own warm start) and how many training seeds within each, and both are drawn from
the SHA-256 of the plan file's bytes (:func:`derive_seeds`). Any edit of the plan, a margin, a comment, draws new
seeds, so a result on the deciding seeds can only have been made after the plan's final bytes existed: its seeds
cannot be known earlier. The grid runs the plan's arms on exactly these seeds (``calibrl.grid.runs``); the seeds
that designed the plan are named in it (``design``) and a drawn seed never equals one of them.

**The unit of replication is the data seed.** A training seed belongs to exactly one data seed (a nested design);
the primaries' test averages each data seed's paired differences over its training seeds and runs Student's t on
those means, with (data seeds - 1) degrees of freedom (``calibrl.report.claims.primary``).

The file's SHA-256 is also part of every run's identity (``calibrl.grid.train_params``) and of the base model's
evaluation, so a changed plan retrains rather than re-deciding old results; each evaluation record carries it,
``results/claims.csv`` records it per row, and the analysis refuses a record made under another plan
(:func:`check_records`) or on seeds the plan did not draw (``calibrl.report.claims.primary``); the config must run
what the plan decides on (:func:`check_config`), so a mismatch is an error at start-up, not an inconclusive table.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

# Definition 2.1's per-problem readings a claim can count (calibrl.modes.reading): some correct mode fell, and of
# those problems, another correct mode rose (reallocated) or none did (declined)
DEFINITION_2_1 = ("oversharpened", "reallocated", "declined")
BASE = "base"  # the arm of the warm start (the model every run starts from), evaluated at step 0 per seed
METRIC = re.compile(r"^(pass_at_\d+|avg_at_\d+|distinct|oversharpened|reallocated|declined)$")  # calibrl.modes.READINGS


class PlanError(ValueError):
    """The plan file is malformed, or the config does not run what it decides on."""


@dataclass(frozen=True)
class Primary:
    """One primary claim: ``arms[0]`` is ``direction`` ("above" / "below") ``arms[1]`` on ``metric``, averaged
    over each run's last ``checkpoints`` evaluated checkpoints; ``margin``: the smallest effect that matters (the
    equivalence margin, and the effect the plan is powered for), in ``unit``."""

    id: str
    claim: str
    arms: tuple[str, str]
    metric: str
    checkpoints: int
    direction: int  # +1 above, -1 below
    margin: float
    unit: str
    splits: tuple[tuple[str, float], ...]  # (split, weight): the weight of each evaluation split in the quantity
    factor: float = 1.0  # metrics DEFINITION_2_1: a correct mode counts as suppressed below this share of the base's
    scope: str = ""  # what the verdict can and cannot support about the paper's claim at scale (the summary shows it)

    @property
    def scale(self) -> float:
        """Result files hold fractions; percentage points for pass/avg metrics and shares of problems, answers for
        distinct."""
        return 1.0 if self.metric == "distinct" else 100.0

    def k(self) -> int | None:
        return int(self.metric.rsplit("_", 1)[1]) if self.metric.startswith(("pass_at_", "avg_at_")) else None

    def weights(self) -> dict[str, float]:
        return dict(self.splits)


@dataclass(frozen=True)
class Plan:
    path: str
    sha256: str
    level: float
    data_seeds: tuple[int, ...]  # drawn from sha256 (derive_seeds)
    seeds: tuple[int, ...]  # the training seeds, data seed by data seed
    data_of: dict[int, int]  # training seed -> its data seed
    looks: tuple[int, ...]
    power: float
    primaries: tuple[Primary, ...]
    secondaries: tuple[Primary, ...] = ()  # a second family, decided as the primaries (Holm within it), after them
    not_decided: tuple[tuple[str, str], ...] = ()  # (claim, why): what the plan says in advance it cannot decide
    step: int | None = None  # the checkpoint the primaries read: the run's final step (grid.train.steps)

    def arms(self) -> set[str]:
        return {a for p in self.claims() for a in p.arms if a != BASE}

    def claims(self) -> tuple[Primary, ...]:
        """Every claim the plan decides: the primaries, then the secondaries."""
        return (*self.primaries, *self.secondaries)


SEED_RANGE = (1_000, 1_000_000)  # drawn seeds: far from the small numbers people pick by hand


def derive_seeds(sha256: str, n_data: int, n_train: int, exclude: set[int] = frozenset()) -> dict[int, list[int]]:
    """``n_data`` data seeds, each with ``n_train`` training seeds, every seed distinct and outside ``exclude``,
    drawn from the plan's SHA-256: seed i of a kind is SHA-256("<sha256>/<kind>/<i>") mod the range (stdlib
    only, so the draw is the same on every machine and version), skipping repeats."""
    lo, hi = SEED_RANGE
    taken = set(exclude)

    def draw(kind: str, n: int) -> list[int]:
        out, i = [], 0
        while len(out) < n:
            seed = lo + int(hashlib.sha256(f"{sha256}/{kind}/{i}".encode()).hexdigest(), 16) % (hi - lo)
            i += 1
            if seed not in taken:
                taken.add(seed)
                out.append(seed)
        return out

    data = draw("data", n_data)
    train = draw("train", n_data * n_train)
    return {d: train[i * n_train : (i + 1) * n_train] for i, d in enumerate(data)}


def digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise PlanError(f"{where}: missing key {key!r}")
    return d[key]


def load(path: str | Path) -> Plan:
    """The plan at ``path``, validated (errors name the file and key)."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"{path}: no such analysis plan file")
    raw = yaml.safe_load(path.read_text())
    where = str(path)
    if "seeds" in raw or "data_seed" in raw:
        raise PlanError(
            f"{where}: seeds and data_seed are drawn from the plan's own SHA-256, not listed: give "
            "replication: {data_seeds: N, training_seeds: M} (calibrl.analysis_plan.derive_seeds)"
        )
    _known(raw, PLAN_KEYS, where)
    sha = digest(path)
    tolerated = TOLERATED.get(sha, frozenset())
    rep = _need(raw, "replication", where)
    n_data, n_train = (
        int(_need(rep, "data_seeds", f"{where}: replication")),
        int(_need(rep, "training_seeds", f"{where}: replication")),
    )
    if n_data < 2 or n_train < 1:
        raise PlanError(f"{where}: replication needs at least 2 data seeds (the test's units) and 1 training seed each")
    design = _need(raw, "design", where)
    designed = {int(x) for x in [*design.get("seeds", []), *design.get("data_seeds", [])]}
    nested = derive_seeds(sha, n_data, n_train, exclude=designed)
    seeds = tuple(s for train in nested.values() for s in train)
    looks = tuple(int(n) for n in raw.get("looks", [n_data]))
    if list(looks) != [n_data]:
        raise PlanError(f"{where}: looks {list(looks)}: only a single look at all {n_data} data seeds is implemented")
    default_splits = raw.get("splits")
    primaries = [
        _claim(p, f"{where}: primary[{i}]", default_splits, tolerated)
        for i, p in enumerate(_need(raw, "primary", where))
    ]
    secondaries = [
        _claim(p, f"{where}: secondary[{i}]", default_splits, tolerated) for i, p in enumerate(raw.get("secondary", []))
    ]
    if len({p.id for p in [*primaries, *secondaries]}) != len(primaries) + len(secondaries):
        raise PlanError(f"{where}: claim ids are not unique (primary and secondary)")
    return Plan(
        path=str(path),
        sha256=sha,
        level=float(raw.get("level", 0.05)),
        data_seeds=tuple(nested),
        seeds=seeds,
        data_of={t: d for d, train in nested.items() for t in train},
        looks=looks,
        power=float(raw.get("power", 0.8)),
        primaries=tuple(primaries),
        secondaries=tuple(secondaries),
        not_decided=tuple(
            (str(_need(n, "claim", f"{where}: not_decided[{i}]")), " ".join(str(n.get("why", "")).split()))
            for i, n in enumerate(raw.get("not_decided", []))
        ),
        step=int(raw["step"]) if "step" in raw else None,
    )


CLAIM_KEYS = frozenset(
    {"id", "claim", "arms", "metric", "checkpoints", "direction", "margin", "unit", "splits", "factor", "scope"}
)
PLAN_KEYS = frozenset(
    {"level", "replication", "looks", "power", "design", "step", "splits", "primary", "secondary", "not_decided"}
)
# Unknown keys a committed plan carries, by its SHA-256: its text cannot change (its seeds are drawn from it). The
# fifth revision's secondary claims put ", ood" unquoted inside YAML flow mappings, which made "ood" a key of its own
# (the claim's split is its splits: {ood: 1}).
TOLERATED = {"4cd0efe64e9c7846e433dd18b4693dd6a3366eaeaaba05394405d56c3d9a6429": frozenset({"ood"})}


def _known(d: dict, keys: frozenset, at: str, tolerated: frozenset = frozenset()) -> None:
    unknown = sorted(set(d) - keys - tolerated, key=str)
    if unknown:
        raise PlanError(
            f"{at}: unknown key(s) {unknown} (known: {sorted(keys)}); a comma in an unquoted value of a "
            "{...} mapping starts a new key: quote the value"
        )


def _claim(p: dict, at: str, default_splits: dict | None, tolerated: frozenset = frozenset()) -> Primary:
    """One claim of the plan (a primary or a secondary), validated; errors name the file, the family and the index."""
    _known(p, CLAIM_KEYS, at, tolerated)
    arms = tuple(_need(p, "arms", at))
    metric = str(_need(p, "metric", at))
    if len(arms) != 2 or arms[0] == BASE:
        raise PlanError(f"{at}: arms must be two, the first a method (base only second): {list(arms)}")
    if not METRIC.match(metric):
        raise PlanError(f"{at}: metric {metric!r} is not pass_at_K, avg_at_K, distinct or one of {DEFINITION_2_1}")
    direction = {"above": 1, "below": -1}.get(_need(p, "direction", at))
    if direction is None:
        raise PlanError(f"{at}: direction must be 'above' or 'below'")
    splits = p.get("splits", default_splits)
    if not isinstance(splits, dict) or not splits:
        raise PlanError(f"{at}: splits: give the evaluation splits' weights, {{split: weight}} (here or plan-wide)")
    if any(not isinstance(w, (int, float)) or w < 0 for w in splits.values()) or not sum(splits.values()) > 0:
        raise PlanError(f"{at}: splits {splits}: weights must be numbers >= 0, not all 0")
    factor = float(p.get("factor", 1.0))
    if not 0 < factor <= 1 or ("factor" in p and metric not in DEFINITION_2_1):
        raise PlanError(f"{at}: factor {factor} is a share in (0, 1], for metrics {DEFINITION_2_1} only")
    return Primary(
        id=str(_need(p, "id", at)),
        claim=str(_need(p, "claim", at)),
        arms=arms,  # type: ignore[arg-type]
        metric=metric,
        checkpoints=int(p.get("checkpoints", 1)),
        direction=direction,
        margin=float(_need(p, "margin", at)),
        unit=str(p.get("unit", "points")),
        splits=tuple((str(k), float(w)) for k, w in splits.items() if w > 0),
        factor=factor,
        scope=" ".join(str(p.get("scope", "")).split()),
    )


def check_config(plan: Plan, grid: dict) -> None:
    """The config runs every primary arm (on the plan's seeds: ``calibrl.grid.runs`` adds them), never lists a seed
    the plan draws, and takes enough samples."""
    for arm in sorted(plan.arms()):
        if arm not in grid["methods"]:
            raise PlanError(f"{plan.path}: primary arm {arm!r} is not in grid.methods")
    listed = {grid["seed"], *(s for seeds in grid["extra_seeds"].values() for s in seeds)}
    if clash := sorted(listed & set(plan.seeds)):
        raise PlanError(
            f"grid.seed / grid.extra_seeds: seeds {clash} are drawn by the plan ({plan.path}); the plan's arms run "
            "them by themselves: list other seeds"
        )
    if grid["data"]["source"] != "countdown":
        raise PlanError(f"{plan.path}: data seeds make new problems: only grid.data.source countdown has them")
    for p in plan.claims():
        if unknown := sorted(set(p.weights()) - set(grid["data"]["eval_splits"])):
            raise PlanError(f"{plan.path}: {p.id} weighs splits {unknown} that grid.data.eval_splits does not evaluate")
    if plan.step is not None and grid["train"]["steps"] != plan.step:
        raise PlanError(
            f"grid.train.steps is {grid['train']['steps']}: the plan ({plan.path}) decides at step {plan.step}, the "
            "final checkpoint; train that many steps or write a new plan"
        )
    need = max((p.k() or 0) for p in plan.claims())
    if grid["eval"]["n"] < need:
        raise PlanError(f"grid.eval.n is {grid['eval']['n']}: the plan's pass@{need} needs at least {need} samples")


def check_records(plan: Plan | None, records: dict[str, str | None]) -> None:
    """Refuse result files (path -> the plan hash they were made under) made under another plan."""
    want = plan.sha256 if plan else None
    wrong = sorted(p for p, h in records.items() if h != want)
    if wrong:
        shown = ", ".join(f"{p} ({records[p] or 'no plan'})" for p in wrong[:3])
        raise PlanError(
            f"{len(wrong)} result file(s) were made under another analysis plan than "
            f"{plan.path + ' ' + plan.sha256[:12] if plan else 'none'}: {shown}{' ...' if len(wrong) > 3 else ''}. "
            "Rerun them under this plan (snakemake reruns them when their settings.json changes) or restore the plan."
        )
