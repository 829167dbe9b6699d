"""DAG planning: `snakemake -n` of the paper's full grid and of the embedded default, against Snakemake's own
start-up.

    .venv/bin/python benchmarks/dag_planning.py [--repeat 3] [--quick]

Times, in the repository (nothing is run, nothing is written but .snakemake metadata):

- ``snakemake --version``: interpreter, Snakemake and plugin start-up, no workflow (the baseline);
- ``snakemake -n --forceall`` of the embedded default (config/config.yaml: the analysis plan's runs);
- ``snakemake -n --configfile config/paper.yaml --replace-workflow-config``: the full paper grid
  (22 training runs, 880 checkpoint evaluations, every table), as tests/test_config.py plans it.

Prints absolute times (target: each dry run under 5 s, issue 45) and the ratios to the start-up. Each is the best
of ``--repeat`` runs by wall time, with that run's CPU time (user + system, the process and its children) beside
it: on a shared machine the wall time counts the other processes' load, the CPU time much less.

Note: at import, the SLURM executor plugin asks ``scontrol show config`` for MinJobAge; where a SLURM client is
installed but no controller answers (as on this machine when the local test cluster is stopped), that call waits
about 9 s in every Snakemake invocation. The command therefore also times each run with a ``scontrol`` on PATH that
fails at once (what a machine without SLURM sees), and reports which of the two environments it is in.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, machine, ratio_line

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PAPER = ["-n", "--configfile", "config/paper.yaml", "--replace-workflow-config"]


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(args: list[str], env: dict) -> tuple[float, float, str]:
    """Wall and CPU seconds of one ``snakemake`` run, and its output."""
    t0, c0 = time.perf_counter(), cpu_children()
    proc = subprocess.run(SNAKEMAKE + args, cwd=REPO, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, cpu_children() - c0
    if proc.returncode != 0:
        sys.exit(f"dag_planning: `snakemake {' '.join(args)}` failed:\n{proc.stderr[-3000:]}")
    return wall, cpu, proc.stdout + proc.stderr


def best(args: list[str], env: dict, repeat: int) -> tuple[float, float, str]:
    """The run with the least wall time of ``repeat`` (its wall and CPU seconds), and the last run's output."""
    runs = [run(args, env) for _ in range(repeat)]
    wall, cpu, _ = min(runs, key=lambda r: r[0])
    return wall, cpu, runs[-1][2]


def jobs_planned(output: str) -> int | None:
    """The total of Snakemake's job stats (after "Job stats:": a GPU grid's plan printed before it has a total too)."""
    m = re.search(r"^total\s+(\d+)\s*$", output[output.find("Job stats:") :], re.M)
    return int(m.group(1)) if m and "Job stats:" in output else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run each, no-SLURM environment only (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1

    stub_dir = Path(tempfile.mkdtemp(prefix="calibrl-noslurm-"))
    try:
        stub = stub_dir / "scontrol"
        stub.write_text("#!/bin/sh\nexit 1\n")  # what the plugin sees without a controller, at once
        stub.chmod(0o755)
        envs = {
            "without SLURM controller probe (scontrol fails at once)": {
                **os.environ,
                "PATH": f"{stub_dir}:{os.environ['PATH']}",
            }
        }
        if not args.quick and shutil.which("scontrol"):
            envs["this machine as is (real scontrol on PATH)"] = dict(os.environ)
        print(f"machine: {machine()}; scontrol on PATH: {shutil.which('scontrol') or 'no'}")
        for label, env in envs.items():
            t_start, c_start, _ = best(["--version"], env, args.repeat)
            t_default, c_default, out_default = best(["-n", "--forceall"], env, args.repeat)
            t_paper, c_paper, out_paper = best(PAPER, env, args.repeat)
            print(f"\n{label}:")
            print(f"  snakemake --version                 {t_start:6.2f} s  (CPU {c_start:5.2f} s)")
            print(
                f"  snakemake -n --forceall (embedded)  {t_default:6.2f} s  (CPU {c_default:5.2f} s), "
                f"{jobs_planned(out_default)} jobs planned (target < 5 s)"
            )
            print(
                f"  snakemake -n (paper grid)           {t_paper:6.2f} s  (CPU {c_paper:5.2f} s), "
                f"{jobs_planned(out_paper)} jobs planned (target < 5 s)"
            )
            print(ratio_line("paper dry run / snakemake --version start-up", t_paper / t_start))
            print(ratio_line("embedded default dry run / snakemake --version start-up", t_default / t_start))
            print(ratio_line("paper dry run / embedded default dry run", t_paper / t_default))
    finally:
        shutil.rmtree(stub_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
