#!/usr/bin/env bash
# Start a private Ray cluster (token authentication, no dashboard), run a command against it, stop Ray at exit.
#
#   ray_cluster.sh COMMAND [ARGS...]
#
# Inside a SLURM allocation (SLURM_JOB_ID set; its nodes from squeue) the first node runs the Ray head and
# every other node a Ray worker; outside one, a single-node cluster on 127.0.0.1 (tests, one-host runs).
# The script waits until all nodes have joined, exports RAY_ADDRESS=<head ip>:<port> (calibrl.backends.openrlhf.
# launch joins it) and runs COMMAND on this host. When COMMAND ends, or the script is interrupted, the Ray
# processes are stopped and the token is deleted (trap on EXIT); the exit status is COMMAND's.
#
# Nobody but the job's user gets in (Ray's token authentication, RAY_AUTH_MODE=token, Ray >= 2.52; off by
# default): a fresh random token per cluster, in a file of mode 0600 inside a directory of mode 0700, named
# by RAY_AUTH_TOKEN_PATH, which every Ray process, the driver and COMMAND inherit. Ray refuses RPCs that lack
# it. The dashboard, and with it the Jobs API, is not started (--include-dashboard=false).
#
# SLURM steps: this script runs inside the executor's own job step (snakemake-executor-plugin-slurm runs a
# rule as `srun -n1 ... snakemake` on the first node of the allocation). Every Ray node, the head included, is
# one step of its own, `srun --overlap --nodes=1 --ntasks=1 -w NODE --gres=gpu:N ray start ... --block`,
# launched with the SLURM_* variables of the enclosing step removed (as the plugin itself does for its own
# srun): the step's task count, CPU binding and GPU request must not leak into the Ray step, which asks for
# the node's GPUs itself, and --overlap lets it start even where the enclosing step holds the node's CPUs or
# GPUs. So the Ray processes get the GPUs whatever the executor's step was given, and the same works from a
# plain sbatch script (no enclosing step). Only COMMAND, the Ray driver, which needs no GPU, runs here.
#
# Settings (environment):
#   RAY_PORT            GCS port of the head (6379)
#   RAY_GPUS_PER_NODE   GPUs per node, requested for each Ray step and announced to Ray (SLURM_GPUS_ON_NODE,
#                       else 0; set it: inside the executor's step SLURM_GPUS_ON_NODE is that step's count)
#   RAY_CPUS_PER_NODE   CPUs Ray announces per node (SLURM_CPUS_ON_NODE, else Ray's own count); at least the
#                       GPUs per node
#   RAY_JOIN_TIMEOUT    seconds to wait for every node to join (300)
#   RAY_SRUN_ARGS       extra srun options for the Ray steps (default: --gres=gpu:N when N GPUs per node)
#   RAY_AUTH_DIR        where the per-cluster token directory is made ($HOME/.calibrl/ray); on a multi-node
#                       cluster it must be on a file system that every node sees (the home directory is)
#   RAY_BIN, RAY_PYTHON the ray CLI (ray) and a python that imports ray (python3)
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi

RAY_BIN=${RAY_BIN:-ray}
RAY_PYTHON=${RAY_PYTHON:-python3}
PORT=${RAY_PORT:-6379}
GPUS=${RAY_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-0}}
CPUS=${RAY_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-}}
TIMEOUT=${RAY_JOIN_TIMEOUT:-300}
# OpenRLHF's placement-group bundles take one CPU per GPU (calibrl.backends.openrlhf.layout.ray_requests): with fewer CPUs than
# GPUs announced, its groups would never be placed and the run would wait forever.
if [ -n "$CPUS" ] && [ "$CPUS" -lt "$GPUS" ]; then
    echo "ray_cluster.sh: $CPUS CPU(s) per node for $GPUS GPU(s): OpenRLHF asks Ray for a CPU per GPU; request" \
        "at least $GPUS CPUs per node (the profile's set-resources: train: cpus_per_task) or set RAY_CPUS_PER_NODE" >&2
    exit 1
fi
if [ -n "${RAY_SRUN_ARGS+x}" ]; then
    read -r -a EXTRA <<< "$RAY_SRUN_ARGS"
elif [ "$GPUS" -gt 0 ]; then
    EXTRA=("--gres=gpu:$GPUS")
else
    EXTRA=()
fi

# ------------------------------------------------------------------------------------------------ token
# A fresh token for this cluster only. umask 077 before anything is created; the base directory must be the
# user's own and closed to others, since whoever can write there could swap the token.
make_token() {
    local base=${RAY_AUTH_DIR:-$HOME/.calibrl/ray}
    umask 077
    mkdir -p "$base"
    if [ "$(stat -c %u "$base")" != "$(id -u)" ]; then
        echo "ray_cluster.sh: RAY_AUTH_DIR=$base is not owned by $(id -un)" >&2
        return 1
    fi
    chmod 700 "$base"
    TOKEN_DIR=$(mktemp -d "$base/job-${SLURM_JOB_ID:-local}.XXXXXX")
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$TOKEN_DIR/token"   # 256 random bits, as Ray's own
    export RAY_AUTH_MODE=token
    export RAY_AUTH_TOKEN_PATH="$TOKEN_DIR/token"
    unset RAY_AUTH_TOKEN   # it would take precedence over the file (an inherited, possibly shared, value)
}

# --------------------------------------------------------------------------------------------- topology
if [ -n "${SLURM_JOB_ID:-}" ]; then
    # The allocation's nodes, from the controller: inside the executor's job step (srun -n1, one node) the
    # environment names only that step's node (SLURM_JOB_NODELIST=<first node>, no SLURM_JOB_NUM_NODES), and a
    # Ray cluster built from it would leave the other nodes out (tests/test_slurm.py, multi-node test).
    NODELIST=$(squeue -h -j "$SLURM_JOB_ID" -o %N 2>/dev/null) || NODELIST=
    if [ -z "$NODELIST" ]; then
        echo "ray_cluster.sh: cannot read the nodes of job $SLURM_JOB_ID (squeue -h -j $SLURM_JOB_ID -o %N)" >&2
        exit 1
    fi
    mapfile -t NODES < <(scontrol show hostnames "$NODELIST")
    if [ "${#NODES[@]}" -eq 0 ]; then
        echo "ray_cluster.sh: no nodes in job $SLURM_JOB_ID's node list '$NODELIST'" >&2
        exit 1
    fi
else
    NODES=(127.0.0.1)   # no allocation: a one-node cluster on loopback
fi
HEAD=${NODES[0]}

# srun for one Ray step on one node, outside the enclosing step's settings (see the header).
step() {  # always in a subshell (&, $(...)): exec makes the pid the one of srun itself
    local node=$1
    shift
    local -a clean=()
    local var
    for var in $(compgen -e); do
        case $var in
            SLURM_JOB_ID | SLURM_JOBID | SLURM_CLUSTER_NAME | SLURM_CONF) ;;
            SLURM_* | SRUN_* | SBATCH_*) clean+=(-u "$var") ;;
        esac
    done
    exec env "${clean[@]}" srun --overlap --nodes=1 --ntasks=1 -w "$node" "${EXTRA[@]}" "$@"
}

if [ "$HEAD" = 127.0.0.1 ]; then
    HEAD_IP=127.0.0.1
else
    HEAD_IP=$(step "$HEAD" hostname --ip-address | awk '{print $1}')
fi
ADDRESS="$HEAD_IP:$PORT"
RESOURCES=(--num-gpus="$GPUS" --disable-usage-stats)
if [ -n "$CPUS" ]; then
    RESOURCES+=(--num-cpus="$CPUS")
fi

PIDS=()
TOKEN_DIR=
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true     # srun passes the signal on to `ray start --block`
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ -n "$TOKEN_DIR" ]; then
        rm -rf "$TOKEN_DIR"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

make_token

echo "ray_cluster.sh: head $HEAD ($ADDRESS), ${#NODES[@]} node(s), $GPUS GPU(s) per node, token auth" >&2
# --include-dashboard is a head-only flag; without the dashboard there is no Jobs API either.
HEAD_CMD=("$RAY_BIN" start --head --node-ip-address="$HEAD_IP" --port="$PORT" --include-dashboard=false
    "${RESOURCES[@]}" --block)
if [ "$HEAD" = 127.0.0.1 ]; then
    "${HEAD_CMD[@]}" &
else
    step "$HEAD" "${HEAD_CMD[@]}" &
fi
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
                echo "ray_cluster.sh: a Ray process exited before the cluster was up" >&2
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
    step "$node" "$RAY_BIN" start --address="$ADDRESS" "${RESOURCES[@]}" --block &
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
