"""Snakemake's scheduler without its job-rate limiter (the Snakefile's ``onstart``).

Snakemake 9.27.1 limits job starts to ``--max-jobs-per-timespan`` (default 100/1s) on local runs too: after every
scheduling round, ``JobScheduler.schedule`` starts a ``threading.Timer`` that triggers another round one timespan
later. A round started by a job's end starts a timer of its own, so the rounds per second grow with the number of
jobs finished, and each round re-reads the input files of every ready job: 24,005 rounds for the 319 jobs of the
embedded default with 2-step runs, 50 s of the main process's CPU against 8 s without the limiter (318 rounds, one
per job end). On one machine nothing is submitted that a rate limit could protect; on SLURM the profile's ``jobs: 100``
caps the jobs in flight, so the default limit (100 a second) never binds there, while its timers would run a round
per second for every job finished so far, for days, on the login node. So the hook removes the limiter before the
first round; rounds then follow job ends (and the executor's status checks), as they do without a limit. A limit the
user set (``--max-jobs-per-timespan`` other than the default, e.g. a site's cap on ``sbatch``) is kept.
"""

from __future__ import annotations

import logging

log = logging.getLogger("calibrl.local_scheduling")
ATTRIBUTE = "job_rate_limiter"  # snakemake.scheduling.job_scheduler.JobScheduler.job_rate_limiter
DEFAULT = (100, 1)  # Snakemake's --max-jobs-per-timespan default, 100/1s: (jobs, seconds)


def unthrottle(workflow) -> None:
    """Remove the job-rate limiter of ``workflow``'s scheduler (a ``snakemake.workflow.Workflow`` in ``onstart``),
    unless the user set a limit of their own."""
    scheduler = getattr(workflow, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, ATTRIBUTE):
        import snakemake

        raise RuntimeError(
            f"calibrl.local_scheduling: Snakemake {snakemake.__version__} has no "
            f"snakemake.scheduling.job_scheduler.JobScheduler.{ATTRIBUTE} on workflow.scheduler (9.27.1 has; "
            "pyproject.toml pins it): install the pinned Snakemake, or drop the unthrottle call from the Snakefile"
        )
    limit = getattr(getattr(workflow, "scheduling_settings", None), "max_jobs_per_timespan", None)
    if limit is not None and (limit.max_jobs, limit.timespan) != DEFAULT:
        log.info("keeping --max-jobs-per-timespan %s/%ss as set", limit.max_jobs, limit.timespan)
        return
    setattr(scheduler, ATTRIBUTE, None)
