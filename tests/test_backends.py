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
from calibrl.checkpoints import RunStamp
from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.models import build_model, build_tokenizer, save

CALLS = []


def _check_implements(obj, protocol, what: str) -> None:
    """``obj`` has every member ``protocol`` declares, its methods with the protocol's parameters."""
    members = {n: m for n, m in inspect.getmembers(protocol) if not n.startswith("_")}
    for member in set(members) | set(protocol.__annotations__):
        assert hasattr(obj, member), f"{what} lacks {member}"
    for method, proto in members.items():
        if callable(proto):
            got = list(inspect.signature(getattr(obj, method)).parameters)
            assert got == list(inspect.signature(proto).parameters)[1:], (what, method)


def test_every_backend_implements_the_protocol():
    """Every backend implements the trainer core and stubs nothing of the GPU side, which a backend that trains on
    GPUs implements as its ``gpu`` (its venv a path under the checkout, its requirements a file of it)."""
    assert {"local", "openrlhf"} <= set(backends.names())
    gpu_members = {n for n, _ in inspect.getmembers(backends.GpuSide) if not n.startswith("_")}
    gpu_members |= set(backends.GpuSide.__annotations__)
    for name in backends.names():
        backend = backends.get(name)
        assert backend.name == name
        _check_implements(backend, backends.Backend, name)
        assert not {m for m in gpu_members if hasattr(backend, m)}, f"{name}: the GPU side's members are its gpu's"
        if backend.gpu is not None:
            _check_implements(backend.gpu, backends.GpuSide, f"{name}.gpu")
            assert not Path(backend.gpu.venv).is_absolute() and (REPO / backend.gpu.requirements).is_file(), name
    assert backends.get("local").gpu is None and backends.get("openrlhf").gpu.venv == ".venv-gpu"
    with pytest.raises(ValueError, match="unknown trainer 'nonesuch'"):
        backends.get("nonesuch")


def test_a_gpu_backends_jobs_run_in_its_own_venv(monkeypatch):
    """The workflow exports CALIBRL_GPU_VENV as the grid's backend's venv under the checkout, unless it is set; a CPU
    backend's grid sets none (its jobs run where Snakemake runs)."""
    monkeypatch.delenv("CALIBRL_GPU_VENV", raising=False)
    paper, micro = filled("paper"), filled(yaml.safe_load((REPO / ".test" / "config.yaml").read_text()))
    assert G.gpu_venv(paper, "/site/calibrl") == "/site/calibrl/.venv-gpu" and G.gpu_venv(micro, "/site") is None
    monkeypatch.setenv("CALIBRL_GPU_VENV", "/site/venv")
    assert G.gpu_venv(paper, "/site/calibrl") == "/site/venv" and G.gpu_venv(micro, "/site") is None


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
        stamp = RunStamp.read(settings)
        assert stamp.method.estimator == "test_leave_none_out"
        steps = cfg["grid"]["train"]["steps"]
        marker = settings.parent / "ckpt" / f"segment_{steps}.done"
        train_job(str(settings), steps, str(marker))
    finally:
        ESTIMATORS.unregister("test_leave_none_out")
    assert len(CALLS) == steps and all(shape[-1] == cfg["grid"]["train"]["group_size"] for shape in CALLS)
    done = json.loads(marker.read_text())
    assert done == {"end": steps, "steps": G.eval_steps(cfg), "fingerprint": stamp.fingerprint}
    for step in done["steps"]:
        assert checkpoints.check_marker(settings.parent / "ckpt" / f"step_{step}.done", stamp.fingerprint)
    metrics_job(str(settings), str(settings.parent / "metrics.jsonl"))
    lines = (settings.parent / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, steps + 1))


def test_weight_decay_is_a_setting_both_backends_apply(tmp_path):
    """AdamW's weight decay comes from grid.train.weight_decay (default 0.01, verl's recipes' value) in the CPU
    trainer and in OpenRLHF's command line alike (it used to be 0 on CPU and 0.01 in OpenRLHF, silently); its scope
    is tests/test_openrlhf.py's business."""
    from calibrl.backends.local.trainer import Trainer

    cfg, settings = _micro_run(tmp_path, {"estimator": "grpo"})
    stamp = RunStamp.read(settings)
    assert stamp.train["weight_decay"] == 0.01 == cfg["grid"]["train"]["weight_decay"]
    trainer = Trainer(stamp.method, stamp.train_settings(steps=1), [], stamp.paths["init"], tmp_path / "run",
                      lambda t, r: [], seed=0)  # fmt: skip
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.01
    paper = filled("paper")
    paper["grid"]["train"]["weight_decay"] = 0.05
    from conftest import paper_settings

    from calibrl.backends.openrlhf.command import build_command

    paper_stamp = RunStamp.read(paper_settings(paper, G.Run("qwen3-8b", "grpo", 0), tmp_path / "p"))
    argv = build_command(paper_stamp, tmp_path / "p", tmp_path / "p.jsonl", 40000)
    assert argv[argv.index("--actor.adam.weight_decay") + 1] == "0.05"


FROZEN = '''"""A throwaway backend (tests/test_backends.py): its policy never moves (each checkpoint is the start)."""

import shutil
from pathlib import Path

from calibrl.checkpoints import RunStamp, write_marker
from calibrl.io import write_json
from calibrl.models import build_model, build_tokenizer, save
from calibrl.runs import checkpoint_steps


class FrozenBackend:
    name = "frozen"
    extends_runs = True
    env = "../../envs/local.yaml"
    ignored = {}
    preload = ()
    gpu = None

    def problems(self, grid, runs):
        return [(f"grid.methods.{spec.name}.dlc_mu", "a frozen policy has no memory") for _, spec in runs
                if spec.uses_dlc]

    def model_file(self, model, data):
        return f"models/{model}/d{data}/init.json"  # rule warmstart makes it

    def inputs(self, grid, run, spec, data):
        return {"init": self.model_file(run.model, data)}

    def segments(self, grid, run, spec):
        return [int(grid["train"]["steps"])]

    def warmstart(self, params, sft_path, model_dir, info_path, threads):
        tokenizer = build_tokenizer()
        save(build_model(tokenizer, seed=params["seed"], **params["arch"]), tokenizer, model_dir)  # untrained
        write_json(info_path, {"model": params["model"], "path": str(Path(model_dir).resolve())})

    def train(self, settings_path, stop_at, threads, workers):
        stamp = RunStamp.read(settings_path)
        ckpt = Path(settings_path).parent / "ckpt"
        for step in checkpoint_steps(stamp.train["eval_every"], stop_at):
            policy = ckpt / f"step_{step}" / "policy"
            if not policy.is_dir():
                shutil.copytree(stamp.paths["init"], policy)
            write_marker(ckpt / f"step_{step}.done", step, policy)
        (Path(settings_path).parent / "metrics.jsonl").write_text("")

    def metrics(self, run_dir, out_path):
        Path(out_path).write_text((Path(run_dir) / "metrics.jsonl").read_text())


BACKEND = FrozenBackend()
'''


@pytest.mark.slow
def test_a_new_backend_is_one_folder(tmp_path):
    """A backend written into a copy of the package, one folder and nothing else, is a valid grid.trainer: the config
    check refuses by key what it cannot run, the DAG plans and runs through it (training, evaluation, the report),
    and the import contracts cover it. (A CPU backend; a GPU one: the test below.)"""
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
    assert RunStamp.read(work / cfg["results"] / "runs/qwen3-tiny-m/grpo/s0/settings.json").backend == "frozen"
    lint = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], cwd=REPO, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert lint.returncode == 0 and "4 kept, 0 broken" in lint.stdout, lint.stdout[-3000:]


RELAY = '''"""A throwaway GPU backend (tests/test_backends.py): its own venv, layout schema, preflight check and
price; it never trains (nothing here runs its jobs)."""

from calibrl.cost import RunCost

LAYOUT = {"type": "object", "additionalProperties": False, "properties": {
    "gpus": {"type": "integer", "minimum": 1, "default": 4}, "dlc": {"type": "object", "default": {}}}}


def ping(p):
    return f"relay: {p['gpus_per_node']} GPUs asked for"


class RelayGpu:
    venv = ".venv-relay"
    requirements = "envs/cluster-gpu.txt"
    layout = {"layout": LAYOUT, "overlay": {"type": "object", "additionalProperties": False,
                                            "properties": {"gpus": {"type": "integer", "minimum": 1}}}}

    def resources(self, grid, run, spec):
        res = grid["models"][run.model]["resources"]
        return {"gpus": res["gpus"], **(res["dlc"] if spec.uses_dlc else {})}

    def request(self, grid, run, spec):
        return {"nodes": 1, "gres": f"gpu:{self.resources(grid, run, spec)['gpus']}"}

    def rollout_engine(self, train, spec, layout, model, memory):
        return None

    def preflight_checks(self):
        return {"relay_ping": ping}

    def vllm_plugin(self, stamp):
        pass

    def train_cost(self, plan, a):
        gpus = int(plan.layout["gpus"])
        return RunCost(len(plan.ends), gpus, 1, gpus, 1.0, 1.0, 1e9, f"{plan.path}: relay's flat price")

    def release(self, policy_dir, step, keep_steps):
        return False


class RelayBackend:
    name = "relay"
    extends_runs = False
    env = "../../envs/cluster-train.yaml"
    ignored = {"warmstart": "Hub models"}
    preload = ()
    gpu = RelayGpu()

    def problems(self, grid, runs):
        return [(f"grid.models.{name}.resources.gpus", "relay runs on at most 8 GPUs")
                for name, model in grid["models"].items() if model["resources"]["gpus"] > 8]

    def model_file(self, model, data):
        return f"models/{model}/hub.json"

    def inputs(self, grid, run, spec, data):
        out = {"init": self.model_file(run.model, data)}
        if spec.uses_dlc:
            out["memory"] = self.model_file(grid["models"][run.model]["memory"], data)
        return out

    def segments(self, grid, run, spec):
        return [int(grid["train"]["steps"])]

    def warmstart(self, params, sft_path, model_dir, info_path, threads):
        raise NotImplementedError("relay starts from Hub models")

    def train(self, settings_path, stop_at, threads, workers):
        raise NotImplementedError("relay never trains")

    def metrics(self, run_dir, out_path):
        raise NotImplementedError


BACKEND = RelayBackend()
'''

RELAY_PROBE = """
import json, sys, yaml
from calibrl import config as C, grid as G, preflight as PF, plan as P
cfg = yaml.safe_load(open(sys.argv[1]))
cfg["grid"]["trainer"] = "relay"
out = {"paper_layouts": C.problems(cfg)}
for spec in cfg["grid"]["models"].values():
    spec.pop("resources", None)
cfg["grid"]["models"]["qwen3-14b"]["resources"] = {"gpus": 16}
out["too_many"] = C.problems(cfg)
cfg["grid"]["models"]["qwen3-14b"]["resources"] = {"gpus": 8}
cfg["grid"]["models"]["qwen3-8b"]["resources"] = {"dlc": {"gpus": 2}}
out["valid"] = C.problems(cfg)
filled = C.validate(cfg)
out["layout"] = filled["grid"]["models"]["qwen3-4b"]["resources"]
out["shapes"] = sorted(PF.shapes(filled))
out["runs"] = len(G.runs(filled))
p = PF.params(filled, "n1-gpu8")
out["checks"] = p["checks"]
out["ran"] = PF.run_checks({**p, "checks": ["relay_ping"]})[0]["detail"]
rows, trains = P.plan(filled)
out["notes"] = sorted({r.note for r in trains if "relay" in r.note})[:1]
out["waivable"] = "relay_ping" in C.schema(trainer="relay")["$defs"]["preflight_check"]["enum"]
print(json.dumps(out))
"""


def test_a_new_gpu_backend_is_one_folder(tmp_path):
    """A GPU backend written into a copy of the package, one folder and nothing else: the config check validates the
    models' resources against its layout schema (OpenRLHF's keys are unknown to it) and refuses by key what it
    cannot run, the planner prices its runs with its cost, the preflight runs its check beside the common ones, and
    Snakemake plans the paper's DAG through it, its preflight first, its SLURM jobs in its own venv."""
    import shutil

    from conftest import SNAKEMAKE, copy_workflow

    work = copy_workflow(tmp_path)
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "calibrl", src / "calibrl", ignore=shutil.ignore_patterns("__pycache__"))
    before = {p: p.read_bytes() for p in [*src.rglob("*"), *work.rglob("*")] if p.is_file()}
    (src / "calibrl" / "backends" / "relay").mkdir()
    (src / "calibrl" / "backends" / "relay" / "__init__.py").write_text(RELAY)
    env = {k: v for k, v in __import__("os").environ.items() if k != "CALIBRL_GPU_VENV"} | {"PYTHONPATH": str(src)}
    probe = subprocess.run([sys.executable, "-c", RELAY_PROBE, str(REPO / "config" / "paper.yaml")], env=env,
                           capture_output=True, text=True, cwd=work)  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    out = json.loads(probe.stdout.splitlines()[-1])
    unknown = ["grid.models.qwen3-8b.resources.colocate_all", "unknown key (allowed here: dlc, gpus)"]
    assert unknown in out["paper_layouts"]
    assert out["too_many"] == [["grid.models.qwen3-14b.resources.gpus", "relay runs on at most 8 GPUs"]]
    assert out["valid"] == [] and out["layout"] == {"gpus": 4, "dlc": {}}  # its schema's defaults, filled in
    assert out["shapes"] == ["n1-gpu2", "n1-gpu4", "n1-gpu8"]  # 4 GPUs, the 14B's 8, the 8B's DLC runs' 2
    assert out["checks"][:6] == ["gpus", "driver", "compiler", "models", "disk", "lock"]
    assert out["checks"][6:] == ["relay_ping", "vllm", "ray"] and out["waivable"]
    assert out["ran"] == "relay: 8 GPUs asked for" and out["notes"] and "relay's flat price" in out["notes"][0]

    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["grid"]["trainer"] = "relay"
    for spec in cfg["grid"]["models"].values():
        spec.pop("resources", None)
    (work / "relay.yaml").write_text(yaml.safe_dump(cfg))
    args = ["-n", "--configfile", "relay.yaml", "--config", f"results={tmp_path}/r"]
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p: p.read_bytes() for p in [*src.rglob("*"), *work.rglob("*")] if p.is_file() and "relay" not in p.parts}
    assert {p: b for p, b in after.items() if p in before} == before  # no file of the package or workflow changed
    text = proc.stdout + proc.stderr
    assert f"SLURM jobs' venv: {work / '.venv-relay'} (CALIBRL_GPU_VENV)" in text  # the workflow exports it
    stats = dict(line.split()[:2] for line in text.split("Job stats:")[1].splitlines()[3:] if len(line.split()) == 2)
    # a training job per run (one segment each), and a preflight per shape: n1-gpu4 (training), n1-gpu8 (engines)
    assert stats["preflight"] == "2" and int(stats["train"]) == out["runs"] > 20, stats


def test_the_vllm_plugin_hands_a_runs_vllm_processes_to_its_backend(tmp_path, monkeypatch):
    """vLLM calls the package's entry point in every process it starts: outside a run nothing happens; in a run's
    processes its backend's ``vllm_plugin`` gets the stamp (OpenRLHF's installs its stand-ins only in a rehearsal)."""
    from calibrl.backends import vllm_plugin
    from calibrl.backends.openrlhf import cpu_standins

    installed = []
    monkeypatch.setattr(cpu_standins, "_install", installed.append)
    monkeypatch.delenv(checkpoints.SETTINGS_ENV, raising=False)
    vllm_plugin.plugin()
    for rehearsal in (False, True):
        path = tmp_path / f"{rehearsal}.json"
        RunStamp.build({"backend": "openrlhf"}, {}, resources={"cpu_rehearsal": rehearsal}).write(path)
        monkeypatch.setenv(checkpoints.SETTINGS_ENV, str(path))
        vllm_plugin.plugin()
    assert installed == ["vllm"]
    RunStamp.build({"backend": "nonesuch"}, {}).write(path)  # the same file, rewritten: read again
    with pytest.raises(ValueError, match="unknown trainer 'nonesuch'"):
        vllm_plugin.plugin()
