"""How late Snakemake noticed the end of each SLURM job of a workflow folder that ran with ``--profile slurm``.

    .venv/bin/python scripts/slurm_status_lag.py WORKDIR [WORKDIR ...]

For every job's SLURM log under ``WORKDIR/.snakemake/slurm_logs/``, the job's own "Finished jobid" time (the job step
writes it as it ends) against the first "Finished jobid" time of the same job in the main Snakemake log
(``WORKDIR/.snakemake/log/``), matched through the "submitted with SLURM jobid" line. The difference is the time
the workflow waited on nothing: the executor plugin's status checks back off (+10 s after each check that finds no
job finished, up to 180 s), so a job of minutes is noticed up to a minute after it ended (tests/slurm_snakemake.py
caps that for the test cluster). Both logs have one-second stamps.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")


def finished(text: str) -> list[tuple[int, str, datetime]]:
    """(Snakemake job id, rule, time) of every "Finished jobid" line, stamped by the last ``[date]`` line before it."""
    out, when = [], None
    for line in text.splitlines():
        if m := STAMP.match(line):
            when = datetime.strptime(" ".join(m[1].split()), "%a %b %d %H:%M:%S %Y")
        elif (m := FINISHED.match(line)) and when is not None:
            out.append((int(m[1]), m[2], when))
    return out


def lags(workdir: Path) -> list[tuple[str, int, float]]:
    """(rule, SLURM job id, seconds between the job's end and Snakemake noticing it) per SLURM job."""
    noticed: dict[tuple[int, int], list[tuple[str, datetime]]] = {}  # (main log, Snakemake job id) -> its ends
    job_of: dict[int, tuple[int, int]] = {}  # SLURM job id -> (main log, Snakemake job id): ids restart per run
    for i, log in enumerate(sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))):
        text = log.read_text(errors="replace")
        job_of.update({int(m[2]): (i, int(m[1])) for m in SUBMITTED.finditer(text)})
        for job, rule, when in finished(text):
            noticed.setdefault((i, job), []).append((rule, when))
    out = []
    for log in sorted((workdir / ".snakemake" / "slurm_logs").glob("**/*.log")):
        ends = finished(log.read_text(errors="replace"))
        if not ends or not log.stem.isdigit() or int(log.stem) not in job_of:
            continue
        _, rule, end = ends[-1]
        seen = [when for r, when in noticed.get(job_of[int(log.stem)], []) if r == rule and when >= end]
        if seen:
            out.append((rule, int(log.stem), (min(seen) - end).total_seconds()))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for workdir in map(Path, argv):
        found = lags(workdir)
        for rule, slurm_id, lag in found:
            print(f"{workdir}: {rule} (SLURM job {slurm_id}) noticed {lag:.0f} s after it ended")
        print(f"{workdir}: {len(found)} SLURM jobs, {sum(lag for *_, lag in found):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
