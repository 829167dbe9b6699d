"""The pre-registered analysis plan: the primary claims, their quantities, test, margins, seeds and looks, in one
YAML file (``grid.claims.plan``) fixed before the data that decide it.

The file's SHA-256 is part of every run's identity (``calibrl.grid.train_params``) and of the base model's
evaluation, so a changed plan retrains rather than re-deciding old results; each evaluation record carries it,
``results/claims.csv`` records it per row, and the analysis refuses a record made under another plan
(:func:`check_records`). The seeds and the data seed that designed the plan are listed in it and must differ from
the ones that decide it (:func:`load` refuses an overlap), and the config must run what the plan decides on
(:func:`check_config`), so a mismatch is an error at start-up, not an inconclusive table.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

BASE = "base"  # the arm of the warm start (the model every run starts from), evaluated at step 0 per seed
METRIC = re.compile(r"^(pass_at_\d+|avg_at_\d+|distinct)$")


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

    @property
    def scale(self) -> float:
        """Result files hold fractions; percentage points for pass/avg metrics, answers for distinct."""
        return 1.0 if self.metric == "distinct" else 100.0

    def k(self) -> int | None:
        return int(self.metric.rsplit("_", 1)[1]) if self.metric != "distinct" else None


@dataclass(frozen=True)
class Plan:
    path: str
    sha256: str
    level: float
    seeds: tuple[int, ...]
    data_seed: int
    looks: tuple[int, ...]
    power: float
    primaries: tuple[Primary, ...]

    def arms(self) -> set[str]:
        return {a for p in self.primaries for a in p.arms if a != BASE}


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
    seeds = tuple(int(s) for s in _need(raw, "seeds", where))
    design = _need(raw, "design", where)
    if overlap := set(seeds) & set(design.get("seeds", [])):
        raise PlanError(f"{where}: seeds {sorted(overlap)} both designed the plan and decide it (design.seeds)")
    data_seed = int(_need(raw, "data_seed", where))
    if data_seed == design.get("data_seed"):
        raise PlanError(f"{where}: data_seed {data_seed} made the problems that designed the plan (design.data_seed)")
    looks = tuple(int(n) for n in raw.get("looks", [len(seeds)]))
    if list(looks) != [len(seeds)]:
        raise PlanError(f"{where}: looks {list(looks)}: only a single look at all {len(seeds)} seeds is implemented")
    primaries = []
    for i, p in enumerate(_need(raw, "primary", where)):
        at = f"{where}: primary[{i}]"
        arms = tuple(_need(p, "arms", at))
        metric = str(_need(p, "metric", at))
        if len(arms) != 2 or arms[0] == BASE:
            raise PlanError(f"{at}: arms must be two, the first a method (base only second): {list(arms)}")
        if not METRIC.match(metric):
            raise PlanError(f"{at}: metric {metric!r} is not pass_at_K, avg_at_K or distinct")
        direction = {"above": 1, "below": -1}.get(_need(p, "direction", at))
        if direction is None:
            raise PlanError(f"{at}: direction must be 'above' or 'below'")
        primaries.append(
            Primary(
                id=str(_need(p, "id", at)),
                claim=str(_need(p, "claim", at)),
                arms=arms,  # type: ignore[arg-type]
                metric=metric,
                checkpoints=int(p.get("checkpoints", 1)),
                direction=direction,
                margin=float(_need(p, "margin", at)),
                unit=str(p.get("unit", "points")),
            )
        )
    if len({p.id for p in primaries}) != len(primaries):
        raise PlanError(f"{where}: primary ids are not unique")
    return Plan(
        path=str(path),
        sha256=digest(path),
        level=float(raw.get("level", 0.05)),
        seeds=seeds,
        data_seed=data_seed,
        looks=looks,
        power=float(raw.get("power", 0.8)),
        primaries=tuple(primaries),
    )


def seeds_of(grid: dict, method: str) -> list[int]:
    return [grid["seed"], *grid.get("extra_seeds", {}).get(method, [])]


def check_config(plan: Plan, grid: dict) -> None:
    """The config runs every primary arm on exactly the plan's seeds, on the plan's problems, with enough samples."""
    for arm in sorted(plan.arms()):
        if arm not in grid["methods"]:
            raise PlanError(f"{plan.path}: primary arm {arm!r} is not in grid.methods")
        if sorted(seeds_of(grid, arm)) != sorted(plan.seeds):
            raise PlanError(
                f"grid.seed / grid.extra_seeds.{arm}: {arm} runs seeds {sorted(seeds_of(grid, arm))}, the plan "
                f"({plan.path}) decides on {sorted(plan.seeds)}"
            )
    if grid["data"]["seed"] != plan.data_seed:
        raise PlanError(f"grid.data.seed is {grid['data']['seed']}, the plan ({plan.path}) decides on {plan.data_seed}")
    need = max((p.k() or 0) for p in plan.primaries)
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
