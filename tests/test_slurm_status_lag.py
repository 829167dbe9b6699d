"""scripts/slurm_status_lag.py on a workflow folder laid out as Snakemake 9 and its SLURM plugin leave it: the job's
own end (its SLURM log) against the first time the main log says it finished, matched through the submission line."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_status_lag.py"

MAIN = """\
[Sun Nov 29 19:32:11 2026]
rule preflight:
    jobid: 0
Job 0 has been submitted with SLURM jobid 632 (log: .snakemake/slurm_logs/rule_preflight/n1-gpu2/632.log).
Job 1 has been submitted with SLURM jobid 633 (log: .snakemake/slurm_logs/rule_train/x/633.log).
[Sun Nov 29 19:34:28 2026]
Finished jobid: 0 (Rule: preflight)
[Sun Nov 29 19:40:01 2026]
Error in rule train:
"""
JOB = """\
[Sun Nov 29 19:34:25 2026]
Finished jobid: 0 (Rule: preflight)
1 of 1 steps (100%) done
"""
FAILED_JOB = "[Sun Nov 29 19:39:00 2026]\nError in rule train:\n"


def test_the_lag_of_each_finished_job_and_none_for_a_failed_one(tmp_path):
    (tmp_path / ".snakemake" / "log").mkdir(parents=True)
    (tmp_path / ".snakemake" / "log" / "2026-11-29T193209.snakemake.log").write_text(MAIN)
    for rel, text in (("rule_preflight/n1-gpu2/632.log", JOB), ("rule_train/x/633.log", FAILED_JOB)):
        path = tmp_path / ".snakemake" / "slurm_logs" / rel
        path.parent.mkdir(parents=True)
        path.write_text(text)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        f"{tmp_path}: preflight (SLURM job 632) noticed 3 s after it ended",
        f"{tmp_path}: 1 SLURM jobs, 3 s in all",
    ]


def test_no_folder_prints_the_usage():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 2 and "slurm_status_lag.py WORKDIR" in out.stderr
