"""Shared fixtures: a copy of the workflow in a temporary directory, and the shared data folder."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibrl import offline

# The lanes of `make test` and the vLLM tests share the machine's cores. torch's default, a thread per core in every
# test process and the subprocesses that inherit this, oversubscribes them, and OpenMP's waiting threads spin: six
# modules of in-process torch took 80 s of CPU that way on 2 cores beside another lane, 51 s with one thread. The
# workflow's jobs set their own (Snakemake's threads); a user's own setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# One set of compile caches for every job the tests start, directly or on the local SLURM (whose jobs get this
# environment): a job's own choice (calibrl.offline.cache_env) differs between a SLURM job ($TMPDIR set) and a
# direct one, and DeepSpeed's CPU all-reduce op (2 min of g++) was built in three folders in one run of the suite.
os.environ.update(offline.cache_env(os.environ))  # only what is unset (or empty) here

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
WORKFLOW_PARTS = ("Snakefile", "workflow", "config", ".test", "scripts", "envs", "profiles")
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
# The SLURM tests' Snakemake: the same, its status checks of the local cluster's jobs at most 3 s apart, where the
# plugin's back-off (for jobs of hours) would notice a finished test job up to a minute late (tests/slurm_snakemake.py)
SNAKEMAKE_ON_SLURM = [sys.executable, str(REPO / "tests" / "slurm_snakemake.py")]
# Ray 2.55.0 as OpenRLHF 0.11.2 pins it (and uv), in a venv of their own (make .venv-cluster/.installed)
LOCAL_SLURM = REPO / "scripts" / "local_slurm.sh"
RAY_VENV = Path(os.environ.get("CALIBRL_CLUSTER_VENV", REPO / ".venv-cluster"))


def ray_python() -> Path:
    """The python of the Ray venv; fails the test with what to run if it is missing."""
    python = RAY_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no Ray test venv at {RAY_VENV}: run `make .venv-cluster/.installed` (make test builds it)")
    return python


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_workflow(dest: Path) -> Path:
    for part in WORKFLOW_PARTS:
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / part)
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def pytest_collection_modifyitems(config, items):
    """``CALIBRL_TEST_LANE``: ``slurm`` keeps the modules that run jobs on the local SLURM (any of whose tests uses
    the ``local_slurm`` fixture), ``rest`` every other module; unset, all. ``make test-main`` runs the two lanes side
    by side: the SLURM modules mostly wait on the scheduler (the retry test keeps the machine 17% busy), and they
    must not run beside each other (they share its three nodes: jobs of two modules would queue behind each other)."""
    lane = os.environ.get("CALIBRL_TEST_LANE")
    if not lane:
        return
    if lane not in ("slurm", "rest"):
        raise pytest.UsageError(f"CALIBRL_TEST_LANE={lane!r}: use slurm, rest, or leave it unset for every test")
    on_slurm = {item.module.__name__ for item in items if "local_slurm" in item.fixturenames}
    keep = [item for item in items if (item.module.__name__ in on_slurm) == (lane == "slurm")]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


@pytest.fixture(autouse=True)
def _no_slurm_probe(request, tmp_path_factory, monkeypatch):
    """Outside the SLURM tests, an ``scontrol`` that fails at once comes first on PATH.

    Snakemake's SLURM executor plugin runs ``scontrol show config`` whenever Snakemake starts; where the SLURM
    client is installed but no controller answers (this machine while scripts/local_slurm.sh is stopped),
    that call waits ~9 s in every ``snakemake`` subprocess. Where no client is installed it fails at once,
    which is what this reproduces.
    """
    if request.node.get_closest_marker("slurm"):
        return
    monkeypatch.setenv("PATH", f"{_no_slurm_bin(tmp_path_factory)}{os.pathsep}{os.environ['PATH']}")


def _no_slurm_bin(tmp_path_factory) -> Path:
    """A folder holding an ``scontrol`` that fails at once (what a machine without SLURM gives the plugin)."""
    bin_dir = tmp_path_factory.getbasetemp() / "no-slurm-bin"
    if not (bin_dir / "scontrol").exists():
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "scontrol").chmod(0o755)
    return bin_dir


@pytest.fixture
def workflow_dir(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path)


@pytest.fixture(scope="session")
def paper_plan(tmp_path_factory):
    """``snakemake -n --printshellcmds --configfile config/paper.yaml`` of the paper grid, once per session (~1,100
    jobs: every test that reads the plan shares it), results under ``<tmp>/r``, with every module the planning
    process imported on stderr (``PYTHONPROFILEIMPORTTIME``). ``.results`` is that folder, ``.text`` stdout and
    stderr."""
    work = copy_workflow(tmp_path_factory.mktemp("paper-plan"))
    shutil.copytree(REPO / "slurm", work / "slurm")
    results = work / "r"
    path = f"{_no_slurm_bin(tmp_path_factory)}{os.pathsep}{os.environ['PATH']}"  # as _no_slurm_probe
    env = {**os.environ, "PATH": path, "PYTHONPROFILEIMPORTTIME": "1"}
    args = ["-n", "--printshellcmds", "--configfile", "config/paper.yaml", "--config", f"results={results}"]
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stderr[-6000:]}")
    proc.results, proc.text = results, proc.stdout + proc.stderr
    return proc


def load_config(workdir: Path, plan: bool = False) -> dict:
    """The workflow's config/config.yaml, to change; without its analysis plan unless ``plan`` (the plan decides on
    the embedded default's 16 seeds and data seed, which a test's smaller grid does not run)."""
    cfg = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    if not plan:
        cfg["grid"]["claims"].pop("plan", None)
    return cfg


def filled(name_or_config, check: bool = True) -> dict:
    """A shipped config (``"config"``, ``"paper"``; or a config dict as written) with the schema's defaults filled
    in, as the workflow reads it; validated first unless ``check`` is False (a config invalid on purpose)."""
    import copy

    from calibrl import config as C

    cfg = name_or_config
    if isinstance(cfg, str):
        cfg = yaml.safe_load((REPO / "config" / f"{cfg}.yaml").read_text())
    cfg = copy.deepcopy(cfg)
    if check:
        return C.validate(cfg)
    grid = cfg.get("grid") if isinstance(cfg, dict) else None
    schema = C.schema(trainer=grid.get("trainer") if isinstance(grid, dict) else None)  # its backend's layout
    return C.fill_defaults(cfg, schema, schema)


def paper_settings(config: dict, run, root: Path, models: dict | None = None) -> Path:
    """The settings.json of a paper-scale ``run`` (``config`` filled) under ``root/runs/...``, as rule run_settings
    writes it, with made-up model folders (``models``: input name -> folder; default empty folders under root)."""
    from calibrl import checkpoints
    from calibrl import grid as G

    spec = G.method(config, run.method)
    names = ["init"] + (["memory"] if spec.uses_dlc else []) + (["success"] if spec.filters else [])
    paths = {n: str(root / n) for n in names} | {"train": str(root / "train.jsonl")} | (models or {})
    for name in ("init", "memory"):
        if name in paths:
            Path(paths[name]).mkdir(parents=True, exist_ok=True)
    digests = {n: "digest" for n in paths}
    stamp = checkpoints.stamp(G.train_params(config, run), digests, paths, G.resources(config, run))
    out = root / "runs" / run.path / "settings.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stamp))
    return out


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def fake_run_results(res: Path, runs, k: int, splits=("test",)) -> tuple[list[str], list[str]]:
    """Evaluation and training files of ``runs`` (model, method, seed) under ``res`` as the workflow leaves
    them (numbers made up; aggregation only reads them). Returns the evaluation and metrics paths."""
    evals, metrics = [], []
    for i, (model, method, seed) in enumerate(runs):
        run = res / "runs" / model / method / f"s{seed}"
        (run / "eval").mkdir(parents=True)
        for step in (25, 50):
            acc = 0.1 * (i + 1) + step / 1000
            split = {f"avg_at_{k}": acc, f"pass_at_{k}": min(1.0, 2 * acc), "distinct_correct": 1.0 + acc}
            path = run / "eval" / f"step_{step}.json"
            path.write_text(json.dumps({"step": step, "splits": dict.fromkeys(splits, split)}))
            evals.append(str(path))
        lines = [{"step": s, "reward": 0.1 * s, "entropy": 1.0 / s, "kl": 0.0, "seconds": 0.1} for s in range(1, 51)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        metrics.append(str(run / "metrics.jsonl"))
    return evals, metrics


def run(cmd, cwd=None, timeout=60, env=None) -> subprocess.CompletedProcess:
    """Run a command in its own process group; on timeout kill the whole group and fail with its output."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, cmd))} timed out after {timeout}s:\n{out[-4000:]}\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="session")
def local_slurm():
    """A running local SLURM, started once a session (the SLURM lane's modules share it). This pytest process
    holds it while the tests run; `stop` stops the daemons only if no other holder (another session, a manual
    `start`) still uses them."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the local SLURM needs Linux")
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/local_slurm.sh installs SLURM with apt-get and starts its daemons")
    if not (shutil.which("slurmctld") and shutil.which("sbatch")) and not shutil.which("apt-get"):
        pytest.skip("SLURM is not installed and apt-get is not available to install it")
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        pytest.fail("snakemake-executor-plugin-slurm is not installed: pip install snakemake-executor-plugin-slurm")
    env = {**os.environ, "LOCAL_SLURM_HOLDER": str(os.getpid())}
    if env.get("CI"):  # CI containers often resolve their hostname to a network address
        env.setdefault("LOCAL_SLURM_HOSTS_ENTRY", "1")
    started = run([str(LOCAL_SLURM), "start"], timeout=900, env=env)
    if started.returncode != 0:
        run([str(LOCAL_SLURM), "stop"], timeout=120, env=env)
        pytest.fail(f"scripts/local_slurm.sh start failed:\n{started.stdout}\n{started.stderr[-6000:]}")
    try:
        yield
    finally:
        stopped = run([str(LOCAL_SLURM), "stop"], timeout=120, env=env)
        assert stopped.returncode == 0, stopped.stderr
