"""The cluster's GPU environment: it resolves against PyPI with this package, and the SLURM profile runs jobs in it.

The resolution runs ``scripts/cluster_env.sh check`` (what users run before ``build``) against PyPI with uv from
``.venv-cluster`` (``make .venv-cluster/.installed``; ``make test`` builds it) for CPython 3.11 on
manylinux_2_28 x86_64: it needs the network to PyPI and fails, saying so, without it. Nothing is installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "cluster_env.sh"
REQUIREMENTS = REPO / "envs" / "cluster-gpu.txt"
PROFILE = REPO / "slurm" / "config.yaml"
CLUSTER_VENV = Path(os.environ.get("CALIBRL_CLUSTER_VENV", REPO / ".venv-cluster"))


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def run_check(tmp_path: Path, requirements: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    uv = CLUSTER_VENV / "bin" / "uv"
    if not uv.exists():
        pytest.fail(f"no uv at {uv}: run `make .venv-cluster/.installed` (make test builds it)")
    env = {**os.environ, "UV": str(uv), "CHECK_OUT": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    if requirements is not None:
        env["CALIBRL_GPU_REQUIREMENTS"] = str(requirements)
    proc = subprocess.run(["bash", str(SCRIPT), "check"], env=env, capture_output=True, text=True, timeout=300)
    if "cannot download" in proc.stderr or "Failed to fetch" in proc.stderr:
        pytest.fail(f"the resolution check needs the network to PyPI, which failed:\n{proc.stderr[-3000:]}")
    return proc, tmp_path / "cluster-gpu.lock.txt"


def pins(lock: Path) -> dict[str, str]:
    out = {}
    for line in lock.read_text().splitlines():
        if m := re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", line):
            out[m[1].lower().replace("_", "-")] = m[2]
        elif line.startswith("-e "):
            out["calibrl"] = line.split(None, 1)[1]
    return out


def test_pinned_gpu_stack_resolves_with_this_package(tmp_path):
    proc, lock = run_check(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OpenRLHF block matches the wheel's" in proc.stdout  # envs/cluster-gpu.txt == openrlhf 0.11.2 METADATA
    got = pins(lock)
    want = {"torch": "2.13.0", "vllm": "0.29.0", "ray": "2.55.0", "deepspeed": "0.19.6", "transformers": "5.15.0"}
    assert {k: got.get(k) for k in want} == want
    assert Path(got["calibrl"].removeprefix("file://")) == REPO  # this checkout, editable, in the same pass
    assert "nvidia-cuda-runtime" in got or "nvidia-cuda-runtime-cu12" in got  # PyPI's torch: the CUDA build
    assert "flash-attn" not in got and "snakemake-executor-plugin-slurm-jobstep" in got
    assert "snakemake-executor-plugin-slurm" not in got  # the submitting plugin stays on the login node


def test_check_refuses_a_set_that_cannot_resolve(tmp_path):
    """The login-node half of the SLURM plugin needs numpy>=2.4.5, vLLM 0.29.0 numpy<2.4: the check must fail."""
    bad = tmp_path / "bad.txt"
    bad.write_text(REQUIREMENTS.read_text() + "snakemake-executor-plugin-slurm==2.8.0\n")
    proc, _ = run_check(tmp_path, bad)
    assert proc.returncode != 0 and "does not resolve" in proc.stderr, proc.stderr[-3000:]
    dropped = tmp_path / "dropped.txt"
    dropped.write_text(REQUIREMENTS.read_text().replace("deepspeed==0.19.6\n", ""))
    proc, _ = run_check(tmp_path, dropped)
    assert proc.returncode != 0 and "missing ['deepspeed==0.19.6']" in proc.stderr, proc.stderr[-3000:]


def test_conda_envs_repeat_the_venv_and_install_the_package_from_the_checkout():
    """`--sdm conda`: the same pip list, and no relative path (it would resolve against .snakemake/conda/)."""
    venv_reqs = requirement_lines(REQUIREMENTS)
    for name in ("cluster-train", "cluster-eval", "local"):
        env = yaml.safe_load((REPO / "envs" / f"{name}.yaml").read_text())
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        assert not any(r.startswith(("-e", ".", "/")) or ".." in r for r in pip), (name, pip)
        if name != "local":
            assert pip == venv_reqs, name
        deploy = (REPO / "envs" / f"{name}.post-deploy.sh").read_text()
        assert ("scripts/cluster_env.sh post" in deploy) or ("pip install -e ." in deploy)


def test_profile_runs_slurm_jobs_in_the_gpu_venv(tmp_path):
    """Snakemake's own parser reads the profile; its precommand, run by sh, puts the venv's python first."""
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.settings import SharedFSUsage

    cwd = os.getcwd()
    os.chdir(REPO)  # `--profile slurm` is looked up in the working directory
    try:
        _, args = parse_args(["--profile", "slurm", "-n"])
    finally:
        os.chdir(cwd)
    usage = set(args.shared_fs_usage)
    # without it the remote executor runs jobs as `python -m snakemake` (PATH), not the login node's interpreter
    assert SharedFSUsage.SOFTWARE_DEPLOYMENT not in usage and SharedFSUsage.SOURCES in usage

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    which = f"{args.precommand} && command -v python"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    ok = subprocess.run(["sh", "-c", which], env={**env, "CALIBRL_GPU_VENV": str(venv)}, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == str(venv / "bin" / "python"), ok.stderr
    (tmp_path / "work" / ".venv-gpu" / "bin").mkdir(parents=True)  # the default: <workdir>/.venv-gpu
    os.symlink(sys.executable, tmp_path / "work" / ".venv-gpu" / "bin" / "python")
    ok = subprocess.run(["sh", "-c", which], cwd=tmp_path / "work", env=env, capture_output=True, text=True)
    assert ok.stdout.strip().endswith("/work/.venv-gpu/bin/python"), ok.stderr
    missing = subprocess.run(["sh", "-c", which], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "scripts/cluster_env.sh build" in missing.stderr


def test_profile_leaves_gpu_requests_to_the_config():
    """train, evaluate and rank_train request their nodes and GPUs from the config (calibrl.backends.openrlhf.layout,
    grid.eval): a `nodes`, `gres` or `gpu` in the profile's set-resources would replace that request."""
    resources = yaml.safe_load(PROFILE.read_text())["set-resources"]
    for rule in ("train", "evaluate", "rank_train"):
        assert not {"nodes", "gres", "gpu"} & set(resources[rule]), rule
    assert resources["train_metrics"]["slurm_partition"] == "cpu"
