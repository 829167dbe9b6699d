#!/usr/bin/env bash
# Snakemake runs this once in the new conda environment, from its working directory (this checkout).
set -euo pipefail
[ -f pyproject.toml ] && grep -q '^name = "calibrl"' pyproject.toml ||
    { echo "run snakemake from the calibrl checkout ($PWD is not)" >&2; exit 1; }
python -m pip install -e .
