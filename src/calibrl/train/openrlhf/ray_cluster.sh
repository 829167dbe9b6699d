#!/usr/bin/env bash
# Start a Ray cluster over the nodes of this SLURM allocation, run a command against it, stop Ray at exit.
#
#   ray_cluster.sh COMMAND [ARGS...]        (inside sbatch/salloc, one or more nodes)
#
# The first node of SLURM_JOB_NODELIST (`scontrol show hostnames`) runs the Ray head, every other node a
# Ray worker, each as a blocking `srun` step; the script waits until all nodes have joined, exports
# RAY_ADDRESS=<head ip>:<port> (calibrl.train.openrlhf.launch joins it) and runs COMMAND on this host.
# When COMMAND ends, or the script is interrupted, the Ray steps are stopped (trap on EXIT); the exit
# status is COMMAND's.
#
# Settings (environment):
#   RAY_PORT            GCS port of the head (6379)
#   RAY_GPUS_PER_NODE   GPUs Ray announces per node (SLURM_GPUS_ON_NODE, else 0)
#   RAY_CPUS_PER_NODE   CPUs Ray announces per node (SLURM_CPUS_ON_NODE, else Ray's own count)
#   RAY_JOIN_TIMEOUT    seconds to wait for every node to join (300)
#   RAY_SRUN_ARGS       extra srun options for the Ray steps (default: --gres=gpu:N when N GPUs per node)
#   RAY_BIN, RAY_PYTHON the ray CLI (ray) and a python that imports ray (python3)
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
: "${SLURM_JOB_NODELIST:?ray_cluster.sh must run inside a SLURM allocation}"

RAY_BIN=${RAY_BIN:-ray}
RAY_PYTHON=${RAY_PYTHON:-python3}
PORT=${RAY_PORT:-6379}
GPUS=${RAY_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-0}}
CPUS=${RAY_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-}}
TIMEOUT=${RAY_JOIN_TIMEOUT:-300}
if [ -n "${RAY_SRUN_ARGS+x}" ]; then
    read -r -a EXTRA <<< "$RAY_SRUN_ARGS"
elif [ "$GPUS" -gt 0 ]; then
    EXTRA=("--gres=gpu:$GPUS")
else
    EXTRA=()
fi

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if [ "${#NODES[@]}" -eq 0 ]; then
    echo "ray_cluster.sh: no nodes in SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2
    exit 1
fi
HEAD=${NODES[0]}
HEAD_IP=$(srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" hostname --ip-address | awk '{print $1}')
ADDRESS="$HEAD_IP:$PORT"
RESOURCES=(--num-gpus="$GPUS")
if [ -n "$CPUS" ]; then
    RESOURCES+=(--num-cpus="$CPUS")
fi

PIDS=()
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true     # srun passes the signal on to `ray start --block`
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "ray_cluster.sh: head $HEAD ($ADDRESS), ${#NODES[@]} node(s), $GPUS GPU(s) per node" >&2
srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" "${EXTRA[@]}" \
    "$RAY_BIN" start --head --node-ip-address="$HEAD_IP" --port="$PORT" "${RESOURCES[@]}" --block &
PIDS+=("$!")

alive_nodes() {
    "$RAY_PYTHON" - "$ADDRESS" <<'PY' 2>/dev/null || echo 0
import sys

import ray

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for node in ray.nodes() if node.get("Alive")))
PY
}

wait_for() {  # wait_for N: until N nodes are alive, or fail after TIMEOUT seconds
    local want=$1 start=$SECONDS have=0
    while :; do
        for pid in "${PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "ray_cluster.sh: a Ray step exited before the cluster was up" >&2
                return 1
            fi
        done
        have=$(alive_nodes | tail -n 1)
        if [ "${have:-0}" -ge "$want" ]; then
            return 0
        fi
        if [ $((SECONDS - start)) -ge "$TIMEOUT" ]; then
            echo "ray_cluster.sh: only ${have:-0} of $want node(s) joined within ${TIMEOUT}s" >&2
            return 1
        fi
        sleep 2
    done
}

wait_for 1
for node in "${NODES[@]:1}"; do
    srun --nodes=1 --ntasks=1 --overlap -w "$node" "${EXTRA[@]}" \
        "$RAY_BIN" start --address="$ADDRESS" "${RESOURCES[@]}" --block &
    PIDS+=("$!")
done
wait_for "${#NODES[@]}"

export RAY_ADDRESS="$ADDRESS"
echo "ray_cluster.sh: ${#NODES[@]} node(s) up; RAY_ADDRESS=$RAY_ADDRESS; running: $*" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
