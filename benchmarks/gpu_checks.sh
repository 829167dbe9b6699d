#!/usr/bin/env bash
# The checks only a GPU can make (issue 32), as one short run on one GPU machine with torch and transformers
# (no vLLM, OpenRLHF, DeepSpeed or Ray needed). From the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_checks.sh        # PY=python3 by default; calibrl from src/
#
# Writes env.txt (nvidia-smi, versions), gpu_peak_memory.txt, gpu_peak_memory_no_entropy.txt and
# memory_update_efficiency.txt into $OUT (default /tmp/gpu_checks), each command under `timeout`.
# Figures and commands are recorded in docs/cluster.md ("Measured on an H100").
set -u
OUT=${OUT:-/tmp/gpu_checks}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

check() {  # check NAME SECONDS COMMAND...: run COMMAND under a timeout, its output to the screen and $OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name: $* (timeout ${limit}s)" | tee "$OUT/$name.txt"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt"
}

{
    date -u
    nvidia-smi
    $PY -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "cuda",
torch.version.cuda, "transformers", transformers.__version__, torch.cuda.get_device_name(0))'
    nproc
} 2>&1 | tee "$OUT/env.txt"

check gpu_peak_memory 150 $PY benchmarks/gpu_peak_memory.py --device cuda --tokens 9216 --packed 1,3
check gpu_peak_memory_no_entropy 90 $PY benchmarks/gpu_peak_memory.py --device cuda --tokens 9216 --packed 1 --no-entropy
check memory_update_efficiency 300 $PY benchmarks/memory_update_efficiency.py --device cuda --sequences 1,3,30 --repeat 5
