"""DAG planning: `snakemake -n` of the paper's full grid, against Snakemake's own start-up.

    .venv/bin/python benchmarks/dag_planning.py [--repeat 3] [--quick]

Times, in the repository (nothing is run, nothing is written but .snakemake metadata):

- ``snakemake --version``: interpreter, Snakemake and plugin start-up, no workflow (the baseline);
- ``snakemake -n`` of the embedded default (config/config.yaml);
- ``snakemake -n --configfile config/paper.yaml --replace-workflow-config``: the full paper grid
  (22 training runs, 880 checkpoint evaluations, every table), as tests/test_config.py plans it.

Prints absolute times (target: the paper dry run under 5 s) and the ratios to the start-up. Each is the best
of ``--repeat`` runs. Note: at import, the SLURM executor plugin asks ``scontrol show config`` for
MinJobAge; where a SLURM client is installed but no controller answers (as on this machine when the local
test cluster is stopped), that call waits about 9 s in every Snakemake invocation. The command therefore
also times each run with a ``scontrol`` on PATH that fails at once (what a machine without SLURM sees), and
reports which of the two environments it is in.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, machine, ratio_line

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
PAPER = ["-n", "--configfile", "config/paper.yaml", "--replace-workflow-config"]


def run(args: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(SNAKEMAKE + args, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"dag_planning: `snakemake {' '.join(args)}` failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout + proc.stderr


def best(args: list[str], env: dict, repeat: int) -> tuple[float, str]:
    runs = [run(args, env) for _ in range(repeat)]
    return min(t for t, _ in runs), runs[-1][1]


def jobs_planned(output: str) -> int | None:
    m = re.search(r"^total\s+(\d+)", output, re.M)
    return int(m.group(1)) if m else None


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
            t_start, _ = best(["--version"], env, args.repeat)
            t_default, out_default = best(["-n", "--forceall"], env, args.repeat)
            t_paper, out_paper = best(PAPER, env, args.repeat)
            print(f"\n{label}:")
            print(f"  snakemake --version                 {t_start:6.2f} s")
            print(f"  snakemake -n --forceall (embedded)  {t_default:6.2f} s, {jobs_planned(out_default)} jobs planned")
            print(
                f"  snakemake -n (paper grid)           {t_paper:6.2f} s, {jobs_planned(out_paper)} jobs planned "
                "(target < 5 s)"
            )
            print(ratio_line("paper dry run / snakemake --version start-up", t_paper / t_start))
            print(ratio_line("paper dry run / embedded default dry run", t_paper / t_default))
    finally:
        shutil.rmtree(stub_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
