#!/usr/bin/env bash
# Start a private Ray cluster (token authentication, no dashboard), run a command against it, stop Ray at exit.
#
#   ray_cluster.sh COMMAND [ARGS...]
#   ray_cluster.sh --node-ip [PEER...]   print the address this node would announce to PEERs (diagnostics)
#
# Inside a SLURM allocation (SLURM_JOB_ID set; its nodes from squeue) the first node runs the Ray head and
# every other node a Ray worker; outside one, a single-node cluster on this host (tests, one-host runs).
# The script waits until all nodes have joined, exports RAY_ADDRESS=<head ip>:<port> (calibrl.backends.openrlhf.
# launch joins it) and runs COMMAND on this host. When COMMAND ends, or the script is interrupted, the Ray
# processes are stopped and the token and temp directories are deleted (traps on EXIT); the exit status is
# COMMAND's.
#
# Nobody but the job's user gets in (Ray's token authentication, RAY_AUTH_MODE=token, Ray >= 2.52; off by
# default): a fresh random token per cluster, in a file of mode 0600 inside a directory of mode 0700, named
# by RAY_AUTH_TOKEN_PATH, which every Ray process, the driver and COMMAND inherit. Ray refuses RPCs that lack
# it (its servers listen on every interface). The dashboard, and with it the Jobs API, is not started
# (--include-dashboard=false).
#
# Shared nodes: Ray's defaults assume one Ray per machine, and fail or mix clusters where other jobs or users
# run Ray on the same node.
# - Temp dir. Ray's default, /tmp/ray (or $TMPDIR/ray), may be another user's and unwritable, and holds
#   ray_current_cluster, the address a bare ray.init() joins. Every node gets a fresh directory of its own,
#   <RAY_TMPDIR>/ray-<uid>-<job>.XXXXXX, mode 0700 (Ray makes its temp dir inside it world-writable), and Ray's
#   temp dir is <it>/ray (--temp-dir, and RAY_TMPDIR=<it> for Ray's processes, so that Ray's default is the
#   same place). COMMAND gets one too, as RAY_TMPDIR, whose ray/ray_current_cluster names this cluster. Each
#   is removed when its node stops. Ray's Unix sockets, <temp>/session_<date>_<pid>/sockets/plasma_store, must
#   fit in 107 bytes, which leaves 41 for Ray's temp dir: a long RAY_TMPDIR falls back to <RAY_TMPDIR>/r.XXXXXX,
#   then fails.
# - Ports. Ray's fixed defaults collide between two clusters on one node: GCS 6379, the ray client server
#   10001 (only where grpcio is installed), the dashboard agent's 52365 (even with no dashboard) and the worker
#   range 10002-19999. The GCS port is chosen by the head's GCS itself (--port=0), the client server's on the
#   head node, every other port is 0 (the OS picks a free one when the process binds).
# - Node address. `hostname --ip-address` gives 127.0.1.1 on Debian-style hosts, and Ray's own choice is
#   the interface of the default route, which compute nodes may lack or not use between them. Each node
#   announces (--node-ip-address) the address of its route to the others: a worker to the head, the head to
#   the other nodes (their SLURM NodeAddr). A loopback address only where every peer is on loopback too: the
#   test cluster of scripts/local_slurm.sh, where all nodes are this host (Ray itself then announces this
#   host's default-route address: ray/_private/services.py resolve_ip_for_localhost).
#
# SLURM steps: this script runs inside the executor's own job step (snakemake-executor-plugin-slurm runs a
# rule as `srun -n1 ... snakemake` on the first node of the allocation). Every Ray node, the head included, is
# one step of its own, `srun --overlap --nodes=1 --ntasks=1 -w NODE --cpus-per-task=C --cpu-bind=none --mem=0
# --gres=gpu:N bash -c ... ray start --block`, launched with the SLURM_* variables of the enclosing step removed
# (as the plugin itself does for its own srun): the step's task count, CPU binding and GPU request must not leak
# into the Ray step, which asks for the node's GPUs itself, and --overlap lets it start even where the enclosing
# step holds the node's CPUs, memory or GPUs. So the Ray processes get the GPUs whatever the executor's step was
# given, and the same works from a plain sbatch script (no enclosing step). Only COMMAND, the Ray driver, which
# needs no GPU, runs here.
# CPUs: the Ray step asks for all the job's CPUs on its node (C: `scontrol show job -d`, else
# SLURM_JOB_CPUS_PER_NODE). Since Slurm 22.05 srun takes no --cpus-per-task from sbatch (and the plugin's goes with
# SLURM_*), so its one task would get one CPU, and where tasks are bound by default (TaskPluginParam=cores, a
# node's CpuBind; task/affinity, which Slurm recommends stacking with task/cgroup) raylet, every actor, the vLLM
# engines and the grading pools would share one core. Ray's processes are not MPI ranks to pin: --cpu-bind=none
# leaves them every CPU of the step (a cgroup still fences them to the job's; with task/affinity alone they may
# also use the node's other CPUs). --mem=0: all the job's memory on the node (srun(1): zero for a step), not a
# default the site may set for steps.
#
# Settings (environment):
#   RAY_PORT            GCS port of the head (0: a free one, picked by the GCS)
#   RAY_GPUS_PER_NODE   GPUs per node, requested for each Ray step and announced to Ray (SLURM_GPUS_ON_NODE,
#                       else 0; set it: inside the executor's step SLURM_GPUS_ON_NODE is that step's count)
#   RAY_CPUS_PER_NODE   CPUs Ray announces per node (SLURM_CPUS_ON_NODE, else Ray's own count); at least the
#                       GPUs per node
#   RAY_JOIN_TIMEOUT    seconds to wait for every node to join (300)
#   RAY_SRUN_ARGS       extra srun options for the Ray steps (default: --gres=gpu:N when N GPUs per node), after
#                       the script's own --cpus-per-task, --cpu-bind and --mem, which a repeated option overrides
#   RAY_START_ARGS      extra `ray start` options for every node, after this script's (the last of a repeated
#                       option wins), e.g. "--min-worker-port=20000 --max-worker-port=29999" behind a firewall
#   RAY_AUTH_DIR        where the per-cluster token directory is made ($HOME/.calibrl/ray); on a multi-node
#                       cluster it must be on a file system that every node sees (the home directory is)
#   RAY_TMPDIR          where each node's temp directory is made (/tmp; node-local, short: see above)
#   RAY_NODE_IP_ADDRESS the address the head announces (default: its route to the other nodes)
#   RAY_IFACE           network interface whose IPv4 address every node announces (default: see above)
#   RAY_BIN, RAY_PYTHON the ray CLI (ray) and a python that imports ray (python3), of one environment
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]  |  $0 --node-ip [PEER...]" >&2
    exit 2
fi

RAY_BIN=${RAY_BIN:-ray}
RAY_PYTHON=${RAY_PYTHON:-python3}
PORT=${RAY_PORT:-0}
GPUS=${RAY_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-0}}
CPUS=${RAY_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-}}
TIMEOUT=${RAY_JOIN_TIMEOUT:-300}
TMP_BASE=${RAY_TMPDIR:-/tmp}
TAG=${SLURM_JOB_ID:-$$}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export RAY_USAGE_STATS_ENABLED=0   # no usage report from offline nodes: ray start, its processes and the driver

# ------------------------------------------------------------------------------------ node-side functions
# These run on each Ray node, inside its srun step (shipped there with `declare -f`), and on this host.

# The address this node announces, printed: RAY_NODE_IP_ADDRESS (FIXED) or RAY_IFACE's address if set, else the
# local address of this node's route to the first PEER that resolves, else Ray's own choice (route to a public
# address; no packet is sent), else the host name's. Fails if it is a loopback address while a peer is not.
node_ip() {  # node_ip PYTHON IFACE FIXED [PEER...]: ray_node_ip.py beside this script (a shared file system)
    local python=$1
    shift
    "$python" "$HERE/ray_node_ip.py" "$@"
}

# A new directory of mode 0700 for Ray's temp dir (<it>/ray), printed. Its name must leave room for Ray's
# socket paths (the header): <BASE>/ray-<uid>-<TAG>.XXXXXX, else <BASE>/r.XXXXXX, else fail.
private_dir() {  # private_dir BASE TAG
    local base=$1 tag=$2 template n LC_ALL=C   # C: ${#...} counts bytes
    case $base in
        /*) ;;
        *)
            echo "ray_cluster.sh: RAY_TMPDIR=$base is not an absolute path" >&2
            return 1
            ;;
    esac
    for template in "$base/ray-$(id -u)-$tag.XXXXXX" "$base/r.XXXXXX"; do
        n=$((${#template} + 4))
        if [ "$n" -le 41 ]; then
            mktemp -d "$template" && return 0
            echo "ray_cluster.sh: $(uname -n): cannot make a directory in RAY_TMPDIR=$base" >&2
            return 1
        fi
    done
    echo "ray_cluster.sh: RAY_TMPDIR=$base is too long: Ray's temp dir $template/ray would have $n bytes, more" \
        "than the 41 that leave room for its sockets (<temp>/session_<date>_<pid>/sockets/plasma_store) within" \
        "the 107 bytes of a Unix socket path; set RAY_TMPDIR to a shorter directory (default /tmp)" >&2
    return 1
}

# One Ray node, in the foreground until it stops: its temp dir and address, `ray start ... --block` (RAY_START:
# the command up to the node's own options), the directory removed when it stops, also on SIGUSR2 (the script's
# stop) or SIGTERM. The head prints "ray-head-address <ip:port>" on stdout once Ray has written it
# (<temp>/ray_current_cluster; its GCS chose the port); everything Ray prints goes to stderr.
# shellcheck disable=SC2329  # run on the node, through NODE_CODE
ray_node() {  # ray_node ROLE BASE TAG PYTHON IFACE FIXED [PEER...] -- RAY_START...
    local role=$1 base=$2 tag=$3 python=$4 iface=$5 fixed=$6 ip port
    shift 6
    local -a peers=() options=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
        peers+=("$1")
        shift
    done
    shift
    NODE_DIR=$(private_dir "$base" "$tag") || return 1
    RAY_PID=
    # shellcheck disable=SC2317,SC2329  # run by the traps
    stop_node() {
        trap '' USR2 TERM INT   # cleaning up: a second signal must not cut it short
        trap - EXIT
        if [ -n "$RAY_PID" ]; then
            kill -TERM "$RAY_PID" 2>/dev/null
            wait "$RAY_PID" 2>/dev/null
        fi
        local _
        for _ in 1 2 3 4 5; do  # Ray's last processes may still write their logs for a moment
            rm -rf "$NODE_DIR" 2>/dev/null
            [ -e "$NODE_DIR" ] || break
            sleep 1
        done
    }
    trap stop_node EXIT
    trap 'exit 0' USR2   # the script's stop: no error for srun to report
    trap 'exit 143' TERM
    trap 'exit 130' INT
    ip=$(node_ip "$python" "$iface" "$fixed" "${peers[@]}") || return 1
    options=(--temp-dir="$NODE_DIR/ray" --node-ip-address="$ip")
    if [ "$role" = head ]; then
        # The ray client server (head only) listens on 10001 wherever grpcio imports (Ray's own test) and
        # takes no 0: a port free on this node now.
        port=$("$python" -c 'import socket
try:
    import grpc  # noqa: F401
except ImportError:
    raise SystemExit
s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])') || return 1
        if [ -n "$port" ]; then
            options+=(--ray-client-server-port="$port")
        fi
    fi
    echo "ray_cluster.sh: $(uname -n): Ray $role at $ip, temp dir $NODE_DIR/ray" >&2
    export RAY_TMPDIR=$NODE_DIR   # Ray's default temp dir ($RAY_TMPDIR/ray) is then the one given
    "$@" "${options[@]}" >&2 &
    RAY_PID=$!
    if [ "$role" = head ]; then
        while kill -0 "$RAY_PID" 2>/dev/null; do
            if [ -s "$NODE_DIR/ray/ray_current_cluster" ]; then
                echo "ray-head-address $(cat "$NODE_DIR/ray/ray_current_cluster")"
                break
            fi
            sleep 0.5
        done
    fi
    wait "$RAY_PID"
}

if [ "$1" = --node-ip ]; then
    shift
    node_ip "$RAY_PYTHON" "${RAY_IFACE:-}" "${RAY_NODE_IP_ADDRESS:-}" "$@"
    exit
fi

# OpenRLHF's placement-group bundles take one CPU per GPU (calibrl.backends.openrlhf.layout.ray_requests): with
# fewer CPUs than GPUs announced, its groups would never be placed and the run would wait forever.
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
read -r -a START_ARGS <<< "${RAY_START_ARGS:-}"

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

# The job's CPUs on each of its nodes (NODE_CPUS[node]), for the Ray steps (see the header). From the controller
# (`scontrol show job -d`: "Nodes=<nodes> CPU_IDs=<ids> ..." per group of nodes), as the nodes are: inside the
# executor's step the environment may describe that step. Else SLURM_JOB_CPUS_PER_NODE (e.g. "16(x2),8", in node
# order) where it covers every node; else unknown (the step then gets srun's default, with a warning).
declare -A NODE_CPUS=()
count_ids() {  # count_ids 0-3,8,10-11: how many CPU ids the list names
    local part n=0 IFS=,
    for part in $1; do
        if [[ $part == *-* ]]; then n=$((n + ${part#*-} - ${part%-*} + 1)); else n=$((n + 1)); fi
    done
    echo "$n"
}
job_cpus() {
    local nodes ids node n i
    local -a parts=() per_node=()
    while read -r nodes ids; do
        n=$(count_ids "$ids")
        for node in $(scontrol show hostnames "$nodes" 2>/dev/null); do
            NODE_CPUS[$node]=$n
        done
    done < <(scontrol show job -d "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Nodes=\([^ ]*\) CPU_IDs=\([0-9,-]*\) .*/\1 \2/p')
    for node in "${NODES[@]}"; do
        if [ -z "${NODE_CPUS[$node]:-}" ]; then
            NODE_CPUS=()
            break
        fi
    done
    if [ "${#NODE_CPUS[@]}" -gt 0 ]; then
        return 0
    fi
    IFS=, read -r -a parts <<< "${SLURM_JOB_CPUS_PER_NODE:-}"
    for n in "${parts[@]}"; do
        [[ $n =~ ^([0-9]+)(\(x([0-9]+)\))?$ ]] || return 0
        for ((i = 0; i < ${BASH_REMATCH[3]:-1}; i++)); do
            per_node+=("${BASH_REMATCH[1]}")
        done
    done
    if [ "${#per_node[@]}" -eq "${#NODES[@]}" ]; then
        for i in "${!NODES[@]}"; do
            NODE_CPUS[${NODES[i]}]=${per_node[i]}
        done
    fi
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
    HEAD=${NODES[0]}
    # the head's peers, whose route gives its address: the other nodes (its own node alone), at the address
    # SLURM reaches them at (NodeAddr, else the name)
    HEAD_PEERS=()
    for node in "${NODES[@]:1}"; do
        HEAD_PEERS+=("$node")
    done
    if [ "${#HEAD_PEERS[@]}" -eq 0 ]; then
        HEAD_PEERS=("$HEAD")
    fi
    for i in "${!HEAD_PEERS[@]}"; do
        addr=$(scontrol show node -o "${HEAD_PEERS[i]}" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | head -n 1) || addr=
        addr=${addr#NodeAddr=}
        HEAD_PEERS[i]=${addr:-${HEAD_PEERS[i]}}
    done
    job_cpus
else
    NODES=(127.0.0.1)   # no allocation: a one-node cluster on this host
    HEAD=127.0.0.1
    HEAD_PEERS=(127.0.0.1)
fi

# srun for one Ray step on one node, outside the enclosing step's settings, with all the job's CPUs and memory
# there (see the header).
step() {  # always in a subshell (&, $(...)): exec makes the pid the one of srun itself
    local node=$1
    shift
    local -a clean=() own=(--cpu-bind=none --mem=0)
    local var
    for var in $(compgen -e); do
        case $var in
            SLURM_JOB_ID | SLURM_JOBID | SLURM_CLUSTER_NAME | SLURM_CONF) ;;
            SLURM_* | SRUN_* | SBATCH_*) clean+=(-u "$var") ;;
        esac
    done
    if [ -n "${NODE_CPUS[$node]:-}" ]; then
        own=(--cpus-per-task="${NODE_CPUS[$node]}" "${own[@]}")
    else
        echo "ray_cluster.sh: job $SLURM_JOB_ID's CPUs on $node are unknown (scontrol show job -d," \
            "SLURM_JOB_CPUS_PER_NODE): its Ray step gets srun's default CPUs (RAY_SRUN_ARGS=--cpus-per-task=N sets them)" >&2
    fi
    exec env "${clean[@]}" srun --overlap --nodes=1 --ntasks=1 -w "$node" "${own[@]}" "${EXTRA[@]}" "$@"
}

NODE_CODE="HERE=$(printf %q "$HERE"); $(declare -f node_ip private_dir ray_node); ray_node \"\$@\""
launch() {  # launch NODE ray_node's ARGS...: on NODE, in an srun step (here, without SLURM); in a subshell
    local node=$1
    shift
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        step "$node" bash -c "$NODE_CODE" ray-node "$@"
    else
        exec bash -c "$NODE_CODE" ray-node "$@"
    fi
}

COMMON=(--num-gpus="$GPUS" --disable-usage-stats
    # 0: a free port, picked by the OS when the process binds (Ray's defaults are fixed ports or ranges)
    --node-manager-port=0 --object-manager-port=0 --min-worker-port=0 --max-worker-port=0
    --dashboard-agent-listen-port=0 --dashboard-agent-grpc-port=0 --runtime-env-agent-port=0
    --metrics-export-port=0)
if [ -n "$CPUS" ]; then
    COMMON+=(--num-cpus="$CPUS")
fi
COMMON+=("${START_ARGS[@]}")
NODE_ARGS=("$TMP_BASE" "$TAG" "$RAY_PYTHON" "${RAY_IFACE:-}")   # for ray_node, after the role

PIDS=()
TOKEN_DIR=
RUN_DIR=
# Each node is stopped with SIGUSR2, which srun passes on to its step, where ray_node stops Ray and removes its
# temp dir: a SIGTERM srun turns into SIGKILL ("forcing job termination"), which would leave the directory behind.
# SIGTERM only for what still runs a minute later.
# shellcheck disable=SC2329  # the EXIT trap
cleanup() {
    local status=$? pid tries=120 alive
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        kill -USR2 "$pid" 2>/dev/null || true
    done
    while [ "$tries" -gt 0 ]; do
        alive=
        for pid in "${PIDS[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then
                alive=1
            fi
        done
        if [ -z "$alive" ]; then
            break
        fi
        sleep 0.5
        tries=$((tries - 1))
    done
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ -n "$TOKEN_DIR" ]; then
        rm -rf "$TOKEN_DIR"
    fi
    if [ -n "$RUN_DIR" ]; then
        rm -rf "$RUN_DIR"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The driver's own temp directory (also where the head's address arrives), made first: a RAY_TMPDIR too long
# for Ray fails here, before any Ray step.
RUN_DIR=$(private_dir "$TMP_BASE" "$TAG")
make_token

# --include-dashboard is a head-only flag; without the dashboard there is no Jobs API either.
: > "$RUN_DIR/head.out"
launch "$HEAD" head "${NODE_ARGS[@]}" "${RAY_NODE_IP_ADDRESS:-}" "${HEAD_PEERS[@]}" -- \
    "$RAY_BIN" start --head --port="$PORT" --include-dashboard=false "${COMMON[@]}" --block > "$RUN_DIR/head.out" &
PIDS+=("$!")

alive_nodes() {
    RAY_TMPDIR=$RUN_DIR "$RAY_PYTHON" - "$ADDRESS" <<'PY' 2>/dev/null || echo 0
import sys

import ray

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for node in ray.nodes() if node.get("Alive")))
PY
}

running() {  # whether every Ray step still runs
    local pid
    for pid in "${PIDS[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "ray_cluster.sh: a Ray process exited before the cluster was up" >&2
            return 1
        fi
    done
}

wait_for_head() {  # until the head has announced its address (ADDRESS), or fail after TIMEOUT seconds
    local start=$SECONDS
    while :; do
        ADDRESS=$(sed -n 's/^ray-head-address //p' "$RUN_DIR/head.out" | head -n 1) || ADDRESS=
        if [ -n "$ADDRESS" ]; then
            return 0
        fi
        running || return 1
        if [ $((SECONDS - start)) -ge "$TIMEOUT" ]; then
            echo "ray_cluster.sh: the Ray head on $HEAD did not start within ${TIMEOUT}s" >&2
            return 1
        fi
        sleep 1
    done
}

wait_for() {  # wait_for N: until N nodes are alive, or fail after TIMEOUT seconds
    local want=$1 start=$SECONDS have=0
    while :; do
        running || return 1
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

wait_for_head
echo "ray_cluster.sh: head $HEAD ($ADDRESS), ${#NODES[@]} node(s), $GPUS GPU(s) per node, token auth" >&2
HEAD_IP=${ADDRESS%:*}
HEAD_IP=${HEAD_IP#[}
HEAD_IP=${HEAD_IP%]}
for node in "${NODES[@]:1}"; do
    launch "$node" worker "${NODE_ARGS[@]}" "" "$HEAD_IP" -- \
        "$RAY_BIN" start --address="$ADDRESS" "${COMMON[@]}" --block &
    PIDS+=("$!")
done
wait_for "${#NODES[@]}"

# COMMAND's Ray environment: the cluster's address, also where a bare ray.init() or `ray status` without
# RAY_ADDRESS looks (<RAY_TMPDIR>/ray/ray_current_cluster), never at another cluster on this host
mkdir -p "$RUN_DIR/ray"
printf '%s' "$ADDRESS" > "$RUN_DIR/ray/ray_current_cluster"
export RAY_ADDRESS="$ADDRESS" RAY_TMPDIR="$RUN_DIR"
echo "ray_cluster.sh: ${#NODES[@]} node(s) up; RAY_ADDRESS=$RAY_ADDRESS; running: $*" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
