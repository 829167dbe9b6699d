#!/usr/bin/env bash
# Snakemake runs this once in the new conda environment, from its working directory (this checkout).
set -euo pipefail
[ -f scripts/cluster_env.sh ] || { echo "run snakemake from the calibrl checkout ($PWD is not)" >&2; exit 1; }
bash scripts/cluster_env.sh post
