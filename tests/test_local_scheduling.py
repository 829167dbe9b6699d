"""calibrl.local_scheduling: a local Snakemake run schedules once per job end, not in rounds that multiply."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from calibrl.local_scheduling import unthrottle

JOBS = 12

SNAKEFILE = """
onstart:
    if {hook}:
        from calibrl.local_scheduling import unthrottle

        unthrottle(workflow)


rule all:
    input:
        expand("out/{{i}}.txt", i=range({jobs})),


rule job:
    output:
        "out/{{i}}.txt",
    shell:
        "sleep 0.5 && touch {{output}}"
"""


def rounds(tmp_path, hook: bool) -> int:
    """Scheduling rounds ("Ready jobs" in the verbose log) of a real one-core run of JOBS half-second jobs."""
    (tmp_path / "Snakefile").write_text(textwrap.dedent(SNAKEFILE.format(hook=hook, jobs=JOBS)))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--verbose"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "out").iterdir())) == JOBS
    return proc.stderr.count("Ready jobs")


def test_without_the_limiter_a_round_follows_each_job_end(tmp_path):
    assert rounds(tmp_path, hook=True) <= JOBS + 2


def test_with_snakemakes_limiter_the_rounds_multiply(tmp_path):
    """The control: the pinned Snakemake's rate limiter does what the hook removes (if this fails, the hook may be
    unnecessary with this Snakemake)."""
    assert rounds(tmp_path, hook=False) > 2 * JOBS


def test_a_snakemake_without_the_attribute_is_named():
    with pytest.raises(RuntimeError, match="JobScheduler.job_rate_limiter"):
        unthrottle(SimpleNamespace(scheduler=SimpleNamespace()))


def test_only_snakemakes_default_limit_is_removed():
    from snakemake.settings.types import MaxJobsPerTimespan

    def workflow(limit: str):
        settings = SimpleNamespace(max_jobs_per_timespan=MaxJobsPerTimespan.parse_choice(limit))
        return SimpleNamespace(scheduler=SimpleNamespace(job_rate_limiter=object()), scheduling_settings=settings)

    default, site = workflow("100/1s"), workflow("20/1m")  # the CLI's default; a site's cap on sbatch
    unthrottle(default)
    unthrottle(site)
    assert default.scheduler.job_rate_limiter is None
    assert site.scheduler.job_rate_limiter is not None
