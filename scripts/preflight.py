"""Snakemake script of rule preflight (calibrl.preflight.preflight_job). Guarded: vLLM's engine process re-imports
__main__."""

from calibrl import jobserver

if __name__ == "__main__":
    jobserver.run("calibrl.preflight:preflight_job", snakemake.log[0], snakemake.params.settings, snakemake.output[0])
