"""Backends behind one protocol (calibrl.backends): each implements it, the workflow asks them rather than branching
on the trainer's name, and a run's settings.json is all a backend reads; a formula registered in a test module is
a config value and trains a micro run through the CPU backend."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, filled

from calibrl import backends, checkpoints
from calibrl import grid as G
from calibrl.algo.advantages import ESTIMATORS, estimator
from calibrl.backends.jobs import metrics_job, train_job
from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.models import build_model, build_tokenizer, save

CALLS = []


def test_every_backend_implements_the_protocol():
    members = {n: m for n, m in inspect.getmembers(backends.Backend) if not n.startswith("_")}
    declared = {n for n in backends.Backend.__annotations__}
    assert backends.names() == ["local", "openrlhf"]
    for name in backends.names():
        backend = backends.get(name)
        assert backend.name == name
        for member in set(members) | declared:
            assert hasattr(backend, member), f"{name} lacks {member}"
        for method, proto in members.items():
            if callable(proto):
                got = list(inspect.signature(getattr(backend, method)).parameters)
                assert got == list(inspect.signature(proto).parameters)[1:], (name, method)
    with pytest.raises(ValueError, match="unknown trainer 'verl'"):
        backends.get("verl")


def test_no_trainer_branches_outside_the_backends():
    """The workflow and the package ask the backend rather than compare trainer names (a textual check; the imports,
    by statement and by name, are import-linter's and tests/test_lint.py's)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    code = [p for p in tracked if p.endswith((".py", ".smk")) or p == "Snakefile"]
    pattern = re.compile(r"""trainer["']?\]?\s*[!=]=|\bLOCAL\b|== ?["'](local|openrlhf)["']""")
    offenders = [
        f"{p}:{i}: {line.strip()}"
        for p in code
        if not p.startswith(("src/calibrl/backends/", "tests/"))
        for i, line in enumerate((REPO / p).read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, "\n".join(offenders)
    rules = "".join((REPO / "workflow" / "rules" / f).read_text() for f in ("train.smk", "common.smk"))
    assert len(re.findall(r"^rule train:", rules, re.M)) == 1


def _micro_run(tmp_path: Path, method: dict) -> tuple[dict, Path]:
    """The micro config with ``method`` as method "m", its data file and warm start made by hand, and the run's
    settings.json as rule run_settings writes it."""
    cfg = yaml.safe_load((REPO / ".test" / "config.yaml").read_text())
    cfg["grid"]["methods"]["m"] = method
    cfg["grid"]["tables"]["table2_3"] = ["m"]
    cfg = filled(cfg)
    run = G.Run("qwen3-tiny-m", "m", 0)
    write_jsonl(tmp_path / "train.jsonl", countdown.generate("train", 24, seed=0))
    tok = build_tokenizer()
    arch = G.architecture(cfg["grid"], run.model)
    save(build_model(tok, seed=0, **arch), tok, tmp_path / "init")
    (tmp_path / "init.json").write_text(json.dumps({"path": str(tmp_path / "init")}))
    settings = tmp_path / "runs" / run.path / "settings.json"
    inputs = {"train": str(tmp_path / "train.jsonl"), "init": str(tmp_path / "init.json")}
    checkpoints.settings_job(G.train_params(cfg, run), G.resources(cfg, run), str(settings), inputs)
    return cfg, settings


def test_a_registered_estimator_trains_a_micro_run_through_the_cpu_backend(tmp_path):
    @estimator("test_leave_none_out")
    def leave_none_out(rewards):
        CALLS.append(rewards.shape)
        return rewards - rewards.mean(dim=-1, keepdim=True)

    try:
        cfg, settings = _micro_run(tmp_path, {"estimator": "test_leave_none_out", "iac_alpha": 1.0})
        stamp = json.loads(settings.read_text())
        assert stamp["settings"]["method"]["estimator"] == "test_leave_none_out"
        steps = cfg["grid"]["train"]["steps"]
        marker = settings.parent / "ckpt" / f"segment_{steps}.done"
        train_job(str(settings), steps, str(marker))
    finally:
        ESTIMATORS.unregister("test_leave_none_out")
    assert len(CALLS) == steps and all(shape[-1] == cfg["grid"]["train"]["group_size"] for shape in CALLS)
    done = json.loads(marker.read_text())
    assert done == {"end": steps, "steps": G.eval_steps(cfg), "fingerprint": stamp["fingerprint"]}
    for step in done["steps"]:
        assert checkpoints.check_marker(settings.parent / "ckpt" / f"step_{step}.done", stamp["fingerprint"])
    metrics_job(str(settings), str(settings.parent / "metrics.jsonl"))
    lines = (settings.parent / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, steps + 1))


def test_weight_decay_is_a_setting_both_backends_apply(tmp_path):
    """AdamW's weight decay comes from grid.train.weight_decay (default 0.01, verl's recipes' value) in the CPU
    trainer and in OpenRLHF's command line alike (it used to be 0 on CPU and 0.01 in OpenRLHF, silently); its scope
    is tests/test_openrlhf.py's business."""
    from calibrl.backends.local.trainer import Trainer
    from calibrl.spec import MethodSpec, TrainSettings

    cfg, settings = _micro_run(tmp_path, {"estimator": "grpo"})
    stamp = json.loads(settings.read_text())
    assert stamp["settings"]["train"]["weight_decay"] == 0.01 == cfg["grid"]["train"]["weight_decay"]
    s = stamp["settings"]
    trainer = Trainer(MethodSpec.from_dict(s["method"]), TrainSettings.from_config({**s["train"], "steps": 1}), [],
                      stamp["paths"]["init"], tmp_path / "run", lambda t, r: [], seed=0)  # fmt: skip
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.01
    paper = filled("paper")
    paper["grid"]["train"]["weight_decay"] = 0.05
    from conftest import paper_settings

    from calibrl.backends.openrlhf.command import build_command

    paper_stamp = json.loads(paper_settings(paper, G.Run("qwen3-8b", "grpo", 0), tmp_path / "p").read_text())
    argv = build_command(paper_stamp, tmp_path / "p", tmp_path / "p.jsonl", 40000)
    assert argv[argv.index("--actor.adam.weight_decay") + 1] == "0.05"


FROZEN = '''"""A throwaway backend (tests/test_backends.py): its policy never moves (each checkpoint is the start)."""

import json
import shutil
from pathlib import Path

from calibrl.checkpoints import write_marker
from calibrl.runs import checkpoint_steps


class FrozenBackend:
    name = "frozen"
    on_gpus = False
    extends_runs = True
    env = "../../envs/local.yaml"
    ignored = {}
    preload = ()

    def problems(self, grid, runs):
        return [(f"grid.methods.{spec.name}.dlc_mu", "a frozen policy has no memory") for _, spec in runs
                if spec.uses_dlc]

    def model_file(self, model, data):
        return f"models/{model}/d{data}/init.json"  # rule warmstart makes it

    def inputs(self, grid, run, spec, data):
        return {"init": self.model_file(run.model, data)}

    def segments(self, grid, run, spec):
        return [int(grid["train"]["steps"])]

    def request(self, grid, run, spec):
        return {}

    def resources(self, grid, run, spec):
        return None

    def train(self, settings_path, stop_at, threads, workers):
        stamp = json.loads(Path(settings_path).read_text())
        ckpt = Path(settings_path).parent / "ckpt"
        for step in checkpoint_steps(stamp["settings"]["train"]["eval_every"], stop_at):
            policy = ckpt / f"step_{step}" / "policy"
            if not policy.is_dir():
                shutil.copytree(stamp["paths"]["init"], policy)
            write_marker(ckpt / f"step_{step}.done", step, policy)
        (Path(settings_path).parent / "metrics.jsonl").write_text("")

    def metrics(self, run_dir, out_path):
        Path(out_path).write_text((Path(run_dir) / "metrics.jsonl").read_text())

    def release(self, policy_dir, step, keep_steps):
        return False


BACKEND = FrozenBackend()
'''


@pytest.mark.slow
def test_a_new_backend_is_one_folder(tmp_path):
    """A backend written into a copy of the package, one folder and nothing else, is a valid grid.trainer: the config
    check refuses by key what it cannot run, the DAG plans and runs through it (training, evaluation, the report),
    and the import contracts cover it. (A CPU backend: a GPU one still meets OpenRLHF's preflight and layout schema,
    issue 34.)"""
    import shutil

    from conftest import SNAKEMAKE, copy_workflow

    work = copy_workflow(tmp_path)
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "calibrl", src / "calibrl", ignore=shutil.ignore_patterns("__pycache__"))
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    (src / "calibrl" / "backends" / "frozen").mkdir()
    (src / "calibrl" / "backends" / "frozen" / "__init__.py").write_text(FROZEN)
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file() and "frozen" not in p.parts} == before

    cfg = yaml.safe_load((work / ".test" / "config.yaml").read_text())
    cfg["grid"]["trainer"] = "frozen"
    env = {**__import__("os").environ, "PYTHONPATH": str(src)}

    def run(config: dict, *args: str) -> subprocess.CompletedProcess:
        path = work / "frozen.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd = [*SNAKEMAKE, "--configfile", str(path), *args]
        return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)

    proc = run(cfg, "-n")  # the whole micro grid has a DLC method: refused, by its key
    assert proc.returncode != 0 and "grid.methods.dapo_iac_dlc.dlc_mu" in proc.stdout + proc.stderr
    dlc = [m for m, spec in cfg["grid"]["methods"].items() if spec.get("dlc_mu", 0) > 0]
    for m in dlc:
        del cfg["grid"]["methods"][m]
        for table, names in cfg["grid"]["tables"].items():
            cfg["grid"]["tables"][table] = [n for n in names if n != m]
    run_one = ["--cores", "2", str(Path(cfg["results"]) / "runs" / "qwen3-tiny-m" / "grpo" / "s0" / "eval" / "step_"
                                   f"{cfg['grid']['train']['steps']}.json")]  # fmt: skip
    proc = run(cfg, *run_one)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((work / run_one[-1]).read_text())
    assert (
        out["splits"] and (work / cfg["results"] / "runs" / "qwen3-tiny-m" / "grpo" / "s0" / "settings.json").exists()
    )
    settings = json.loads((work / cfg["results"] / "runs/qwen3-tiny-m/grpo/s0/settings.json").read_text())
    assert settings["settings"]["backend"] == "frozen"
    lint = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=REPO, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert lint.returncode == 0 and "3 kept, 0 broken" in lint.stdout, lint.stdout[-3000:]
