"""Each benchmark command runs at its tiny --quick size and prints a ratio, so that none of them rots.

Timings are never asserted: they are the benchmarks' business (benchmarks/README.md)."""

import re
import subprocess
import sys

import pytest
from conftest import REPO

SHARED_BENCHMARKS = REPO.parent / "shared" / "data" / "benchmarks"
RATIO = re.compile(r"^ratio [^:]+: \d+\.\d\dx", re.M)
pytestmark = pytest.mark.slow  # minutes: `make test-fast` leaves it out, `make test` runs it


@pytest.mark.parametrize(
    "script, extra",
    [
        ("grading_throughput.py", []),
        ("grading_throughput.py", ["--response-chars", "3000"]),
        ("dlc_sampling.py", []),
        ("rollout_throughput.py", []),
        ("sampler_prefill.py", []),
        ("warmstart_encoding.py", []),
        ("countdown_grading.py", []),
        ("dag_planning.py", []),
        ("memory_update_efficiency.py", []),
        ("gpu_peak_memory.py", []),
    ],
)
def test_benchmark_runs_and_prints_a_ratio(script, extra):
    if script == "grading_throughput.py" and not SHARED_BENCHMARKS.is_dir():
        pytest.skip(f"{SHARED_BENCHMARKS} (the real benchmark answers) is absent")
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--quick", *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert RATIO.search(proc.stdout), proc.stdout[-3000:]
    assert "machine:" in proc.stdout
    if script == "grading_throughput.py":
        # The ceiling splits the baseline's items into kinds: every item is counted exactly once.
        items = int(re.search(r"^items: (\d+)", proc.stdout, re.M).group(1))
        per_kind = re.search(r"^baseline per item: (.*)$", proc.stdout, re.M).group(1)
        counts = [int(n) for n in re.findall(r"(?:pairs|pathological) (\d+) in", per_kind)]
        assert len(counts) == 4 and sum(counts) == items, per_kind
        assert "ratio ceiling of any cache + pool grader" in proc.stdout
        assert "verdict agreement with the baseline: 100.0%" in proc.stdout
        median = int(re.search(r"median response (\d+) characters", proc.stdout).group(1))
        assert (median > 1500) == bool(extra), median


def test_embedded_default_benchmark_documents_itself():
    # The full run takes minutes; its command line must still parse.
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "embedded_default.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--cores" in proc.stdout, proc.stderr
