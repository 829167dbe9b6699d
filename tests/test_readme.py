"""Every command of the docs' bash blocks (README.md, docs/*.md, config/README.md, benchmarks/README.md) works as
written, or is named here with the test that runs it or why it cannot run on this machine: the docs are read at test
time, so an edited or added command is checked too. The README stays a guide (at most 200 lines).

Snakemake commands run as dry runs (``-n``: a plan is what the command would do; the SLURM profile's executor is
not contacted), ``calibrl plan`` and ``calibrl toy`` run whole, in a copy of the workflow. Whether the modules, files
and make targets the docs name exist: tests/test_docs.py."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, copy_workflow

BIN = Path(sys.executable).parent
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "config" / "README.md", REPO / "benchmarks" / "README.md"]
README_LINES = 200  # a guide; the reference is in docs/
# Commands that do not run here, each with where it is tested or why not (matched at the start of a command).
ELSEWHERE = {
    "make run": "the embedded default (about 85 min on 2 cores): benchmarks/embedded_default.py times it",
    "make rehearsal": "tests/test_rehearsal*.py (CALIBRL_REHEARSAL=all: two hours); make test runs each DLC run",
    "make test": "CI's own command (.ci/run)",
    ".venv/bin/snakemake --report": "tests/test_workflow_grid.py makes the report of a finished micro grid",
    ".venv/bin/calibrl tables": "tests/test_workflow_grid.py prints the tables of a finished micro grid",
    ".venv/bin/calibrl trainers": "two trainers' finished results: tests/test_rehearsal_verl.py runs it on both "
    "rehearsals' (make test's SLURM lane), tests/test_trainers_compare.py on made-up folders",
    ".venv/bin/calibrl ui": "a server: tests/test_mlflow_ui.py opens a moved results folder's store in Chromium",
    "python3.11 -m venv": "a login node's set-up; tests/test_cluster_env.py resolves the cluster stack",
    "scripts/cluster_env.sh build": "installs the GPU stack (CUDA wheels): tests/test_cluster_env.py checks it",
    "module load": "a site's CUDA module and sbatch: no GPU here",
}


def commands(docs: list[Path] = DOCS) -> list[str]:
    """Every command line of the docs' ```bash blocks (continuations joined, comments dropped)."""
    text = "\n".join(doc.read_text() for doc in docs)
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].split("#")[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                out.append(" ".join(line.split()))
    return out


def local(command: str) -> list[str]:
    """The command as argv, the README's .venv/bin tools taken from this interpreter's venv."""
    return [str(BIN / w.removeprefix(".venv/bin/")) if w.startswith(".venv/bin/") else w for w in shlex.split(command)]


def test_the_readme_is_a_guide():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines: move reference material to docs/"


def test_every_readme_command_is_run_or_accounted_for():
    assert len(commands([README])) >= 15, commands([README])
    found = commands()
    runnable = [c for c in found if not c.startswith(tuple(ELSEWHERE))]
    assert all(c.startswith((".venv/bin/snakemake", ".venv/bin/calibrl ")) for c in runnable), runnable


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("readme"))
    shutil.copytree(REPO / "slurm", work / "slurm")
    return work


@pytest.mark.slow  # a few minutes of dry runs
@pytest.mark.parametrize(
    "command", list(dict.fromkeys(c.removesuffix(" -n") for c in commands() if not c.startswith(tuple(ELSEWHERE))))
)
def test_readme_command(work, command):
    argv = local(command)
    if Path(argv[0]).name == "snakemake" and "-n" not in argv:
        argv.append("-n")  # what it would do, without doing it
    proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command}\n{out[-4000:]}"
    if Path(argv[0]).name == "snakemake":
        assert "Job stats:" in out or "Nothing to be done" in out, out[-3000:]
    if " toy " in f" {command} ":
        out_file = work / argv[argv.index("--out") + 1]
        assert out_file.is_file() and out_file.stat().st_size > 0
