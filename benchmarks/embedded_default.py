"""Time the embedded default (`snakemake --cores 2`) from scratch, with a breakdown per stage.

    .venv/bin/python benchmarks/embedded_default.py [--cores 2] [--keep DIR]

Copies the workflow into a fresh directory, runs the default target, and reports the wall time and,
per rule, the number of jobs and the summed job time (from the first and last time stamp of each job's
log under results/logs/). Stages run side by side on the cores, so the per-stage sums add up to more
than the wall time.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def job_seconds(log: Path) -> float | None:
    stamps = [m.group(1) for line in log.read_text(errors="replace").splitlines() if (m := STAMP.match(line))]
    if len(stamps) < 2:
        return None
    fmt = "%Y-%m-%d %H:%M:%S,%f"
    return (datetime.strptime(stamps[-1], fmt) - datetime.strptime(stamps[0], fmt)).total_seconds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="run in this directory and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="calibrl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    for part in ("Snakefile", "workflow", "config", "scripts", "envs"):
        src = REPO / part
        (shutil.copytree if src.is_dir() else shutil.copy)(
            src, work / part, **({"dirs_exist_ok": True} if src.is_dir() else {})
        )
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(args.cores)], cwd=work)
    wall = time.perf_counter() - start
    stages: dict[str, list[float]] = defaultdict(list)
    for log in sorted((work / "results" / "logs").rglob("*.log")):
        stage = log.relative_to(work / "results" / "logs").parts[0].removesuffix(".log")
        seconds = job_seconds(log)
        if seconds is not None:
            stages[stage].append(seconds)
    print(f"\nembedded default, {args.cores} cores: wall {wall:.0f} s ({wall / 60:.1f} min), exit {proc.returncode}")
    print(f"{'stage':<14}{'jobs':>6}{'job-seconds':>14}{'mean s/job':>12}")
    for stage, times in sorted(stages.items(), key=lambda kv: -sum(kv[1])):
        print(f"{stage:<14}{len(times):>6}{sum(times):>14.0f}{sum(times) / len(times):>12.1f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
