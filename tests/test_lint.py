"""The standing checks: ruff and snakemake --lint are clean."""

import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_package_layers_point_one_way():
    """import-linter's contracts (pyproject.toml, tool.importlinter): no import cycle among calibrl's modules, each
    importing only from the layers below it; the two backends independent of each other."""
    lint = Path(sys.executable).parent / "lint-imports"  # import-linter's command, beside this interpreter
    proc = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and "2 kept, 0 broken" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
