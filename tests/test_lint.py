"""The standing checks: ruff and snakemake --lint are clean."""

import subprocess
import sys

from conftest import REPO


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_is_clean():
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
