"""Time the embedded default (`snakemake --cores 2`) from scratch, with a breakdown per stage.

    .venv/bin/python benchmarks/embedded_default.py [--cores 2] [--keep DIR]

Copies the workflow into a fresh directory, runs the default target, and reports the wall time and,
per rule, the number of jobs and the summed job time, from Snakemake's own log (each job's start and end,
to the second: imports and start-up included). Jobs run side by side on the cores, so the per-rule sums add
up to more than the wall time; their total against cores x the log's span shows how full the cores were.
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
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+)")


def job_seconds(log: Path) -> tuple[dict[str, list[float]], float]:
    """Per rule, the seconds of each of its jobs (start to end, as Snakemake's log stamps them), and the log's span
    from the first start to the last end."""
    now = rule = None
    started: dict[str, tuple[datetime, str]] = {}
    per_rule: dict[str, list[float]] = defaultdict(list)
    first = last = None
    for line in log.read_text(errors="replace").splitlines():
        if m := STAMP.match(line):
            now = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := RULE.match(line):
            rule = m.group(1)
        elif (m := JOBID.match(line)) and rule:
            started[m.group(1)], rule = (now, rule), None
            first = first or now
        elif (m := FINISHED.match(line)) and m.group(1) in started:
            start, name = started.pop(m.group(1))
            per_rule[name].append((now - start).total_seconds())
            last = now
    return per_rule, (last - first).total_seconds() if first and last else 0.0


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
    logs = sorted((work / ".snakemake" / "log").glob("*.snakemake.log"))
    stages, span = job_seconds(logs[-1]) if logs else ({}, 0.0)
    print(f"\nembedded default, {args.cores} cores: wall {wall:.0f} s ({wall / 60:.1f} min), exit {proc.returncode}")
    total = sum(map(sum, stages.values()))
    print(f"jobs' time {total:.0f} s of the {args.cores * span:.0f} core-seconds in the log's span ({span:.0f} s)")
    print(f"{'rule':<16}{'jobs':>6}{'job-seconds':>14}{'mean s/job':>12}")
    for stage, times in sorted(stages.items(), key=lambda kv: -sum(kv[1])):
        print(f"{stage:<16}{len(times):>6}{sum(times):>14.0f}{sum(times) / len(times):>12.1f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
