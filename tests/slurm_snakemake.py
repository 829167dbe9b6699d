"""``python -m snakemake`` for the local test SLURM: the same Snakemake and SLURM executor plugin, its status checks
at most ``CAP`` seconds apart.

The plugin (snakemake-executor-plugin-slurm 2.8.0, ``Executor.check_active_jobs``) waits 10 s longer after every
status check that finds no job finished, up to 180 s: right for a site's jobs of hours, but a test job of two minutes
then ends unnoticed for up to a minute (the preflight job of tests/test_preflight_cluster.py: 62 s between its end in
its SLURM log and Snakemake's "Finished"), and the SLURM tests spend minutes waiting on nothing. Only the wait between
checks changes; every check, submission and result is the plugin's.

    python tests/slurm_snakemake.py --profile slurm ...     (tests: conftest.SNAKEMAKE_ON_SLURM)
"""

import sys
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)  # run as a script: the tests' helper modules stay off Snakemake's path

import snakemake_executor_plugin_slurm as plugin  # noqa: E402

CAP = 3  # seconds; a status check on the local cluster (squeue) takes milliseconds


def _capped(check):
    async def check_active_jobs(self, active_jobs):
        async for job in check(self, active_jobs):
            yield job
        self.next_seconds_between_status_checks = min(self.next_seconds_between_status_checks or CAP, CAP)

    return check_active_jobs


if not hasattr(plugin.Executor, "check_active_jobs"):
    sys.exit(
        "tests/slurm_snakemake.py wraps snakemake_executor_plugin_slurm.Executor.check_active_jobs, which this "
        f"version of the plugin ({getattr(plugin, '__version__', 'unknown')}) no longer has: update the wrapper"
    )
plugin.Executor.check_active_jobs = _capped(plugin.Executor.check_active_jobs)

if __name__ == "__main__":
    from snakemake.cli import main

    main()
