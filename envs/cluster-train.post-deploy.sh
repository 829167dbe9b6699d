#!/usr/bin/env bash
# Runs once inside the new cluster-train environment (Snakemake's post-deploy hook), then installs OpenRLHF.
# flash-attn 2.8.3 is what OpenRLHF 0.11.2 pins; its build needs the installed torch (hence no build
# isolation) and fetches a matching prebuilt wheel when one exists for this torch/CUDA/Python, else compiles (needs nvcc, ~1 h).
set -euo pipefail
python -m pip install --no-build-isolation flash-attn==2.8.3
python -m pip install 'openrlhf[vllm]==0.11.2'   # its pins (above) are already met: nothing is replaced
python -c "import flash_attn, openrlhf, vllm, deepspeed; print('flash-attn', flash_attn.__version__, 'vllm', vllm.__version__)"
