"""Shared fixtures: a copy of the workflow in a temporary directory, and the shared data folder."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
WORKFLOW_PARTS = ("Snakefile", "workflow", "config", "scripts", "envs")
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


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
    bin_dir = tmp_path_factory.getbasetemp() / "no-slurm-bin"
    if not (bin_dir / "scontrol").exists():
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def workflow_dir(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path)


def load_config(workdir: Path) -> dict:
    return yaml.safe_load((workdir / "config" / "config.yaml").read_text())


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
