#!/usr/bin/env bash
# A throwaway SLURM on loopback, to run the workflow's `--profile slurm` path for real: two nodes (two slurmd
# on this host) with stand-in GPUs, so that multi-node GPU requests (--nodes, --gres=gpu:N per node) are
# allocated as on a GPU cluster, with this host's CPUs.
#
#   scripts/local_slurm.sh start    install (if missing) and start munged, slurmctld, the slurmds; wait for idle nodes
#   scripts/local_slurm.sh stop     cancel this cluster's jobs, stop exactly the daemons `start` started
#   scripts/local_slurm.sh stop --force   the same even while other holders use the cluster
#   scripts/local_slurm.sh status   what runs, and `sinfo`; exit 0 only if every node is up
#
# Holders: concurrent users (two pytest sessions) share one cluster. `start` registers the holder
# LOCAL_SLURM_HOLDER (a pid: forgotten once that process is gone; default "manual") and `stop` releases
# it, stopping the daemons only when no other holder is left. start/stop run under a lock.
#
# Debian/Ubuntu, as root (SLURM 22.05 from Debian 12). `start` and `stop` are idempotent; `start` restarts a
# cluster whose config is not what this script writes now (unless other holders use it). The cluster:
# LOCAL_SLURM_NODES nodes, the first named after this host, the others <host>-2, <host>-3, ... (all on this
# host, one slurmd each on its own port); partition `cpu` (default) is the first node, partition `gpu` all
# of them. Each node has CPUs = nproc, RealMemory = MemTotal minus headroom (the nodes share both: a test
# cluster, not a capacity) and LOCAL_SLURM_GPUS stand-in GPUs (gres gpu whose device files are /dev/null:
# SLURM allocates them per node as on a GPU cluster; nothing can compute on them). Accounting is off (so
# `sacct` does not work: the profile uses squeue). Tasks are bound to the cores of their step (task/affinity,
# TaskPluginParam=Cores), as on clusters that bind them: a step of one CPU runs on one core. The nodes share this
# host's cores, so jobs on different nodes may be bound to the same one.
#
# Loopback only: CommunicationParameters=NoCtldInAddrAny,NoInAddrAny make slurmctld, slurmd, slurmstepd
# and srun bind to the address this host's name resolves to (not to every interface), and `start`
# refuses to run unless that address is a loopback one. Machines whose hostname resolves to a network
# address (Docker containers do) can set LOCAL_SLURM_HOSTS_ENTRY=1: `start` then adds a marked
# "127.0.0.1 <hostname>" line to /etc/hosts and `stop` removes it.
#
# Environment (all optional):
#   LOCAL_SLURM_STATE        state folder: pids, spool, logs          [/run/calibrl-local-slurm]
#   LOCAL_SLURM_NODES        nodes of the cluster                     [2]
#   LOCAL_SLURM_GPUS         stand-in GPUs (gres gpu) per node        [8]
#   LOCAL_SLURM_CPUS         CPUs of each node                        [the host's: nproc]
#   LOCAL_SLURM_MEM_MB       RealMemory of each node, MB              [MemTotal - max(1024, 10%)]
#   LOCAL_SLURM_TIMEOUT      seconds to wait for idle nodes           [60]
#   LOCAL_SLURM_HOSTS_ENTRY  1: pin the hostname to 127.0.0.1 in /etc/hosts while running  [0]
#   LOCAL_SLURM_HOLDER       who holds the cluster (see Holders)      [manual]
set -euo pipefail

STATE=${LOCAL_SLURM_STATE:-/run/calibrl-local-slurm}
TIMEOUT=${LOCAL_SLURM_TIMEOUT:-60}
CONF=/etc/slurm/slurm.conf
MARK="# written by calibrl scripts/local_slurm.sh"
HOSTS_MARK="# calibrl local_slurm.sh"
PACKAGES=(slurmctld slurmd slurm-client munge)
NODE=$(hostname -s 2>/dev/null || hostname)
HOLDER=${LOCAL_SLURM_HOLDER:-manual}
[[ $HOLDER =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "local_slurm: error: bad LOCAL_SLURM_HOLDER '$HOLDER'" >&2; exit 1; }
N_NODES=${LOCAL_SLURM_NODES:-2}
GPUS=${LOCAL_SLURM_GPUS:-8}
[[ $N_NODES =~ ^[1-9][0-9]?$ && $GPUS =~ ^[0-9]+$ ]] ||
    { echo "local_slurm: error: LOCAL_SLURM_NODES ($N_NODES) must be 1-99, LOCAL_SLURM_GPUS ($GPUS) a count" >&2; exit 1; }
NODES=("$NODE")
for ((i = 2; i <= N_NODES; i++)); do NODES+=("$NODE-$i"); done
GRES_CONF=/etc/slurm/gres.conf
# the daemons started here, in start order; stop goes in reverse. A slurmd is slurmd@<node>: its pid file
# is $STATE/slurmd@<node>.pid (SlurmdPidFile's %n), its program slurmd.
DAEMONS=(munged slurmctld)
for n in "${NODES[@]}"; do DAEMONS+=("slurmd@$n"); done

say() { echo "local_slurm: $*" >&2; }
die() {
    echo "local_slurm: error: $*" >&2
    exit 1
}

# ------------------------------------------------------------------------------------- processes
# pid recorded for a daemon (munged, slurmctld, slurmd@<node>), if that process is alive and still is that
# program (not a reused pid)
our_pid() {
    local name=$1 pid
    [[ -f $STATE/$name.pid ]] || return 1
    pid=$(tr -dc '0-9' <"$STATE/$name.pid")
    [[ -n $pid ]] || return 1
    [[ -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "${name%%@*}" ]] || return 1
    echo "$pid"
}

# a running process of that program that this script did not start (read-only check)
foreign_pid() {
    local name=$1 ours=" " comm pid d
    for d in "${DAEMONS[@]}"; do
        [[ ${d%%@*} == "$name" ]] && ours+="$(our_pid "$d" || true) "
    done
    for comm in /proc/[0-9]*/comm; do
        [[ $(cat "$comm" 2>/dev/null) == "$name" ]] || continue
        pid=${comm#/proc/}
        pid=${pid%/comm}
        [[ $ours == *" $pid "* ]] || {
            echo "$pid"
            return 0
        }
    done
    return 1
}

wait_gone() { # pid seconds
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

# --------------------------------------------------------------------------------- holders, lock
lock() { # serialize start/stop of concurrent callers
    mkdir -p "$STATE"
    exec 9>"$STATE/lock"
    flock -w "${1:-900}" 9 || die "another local_slurm.sh start/stop holds $STATE/lock"
}

# the holders still using the cluster; pid holders whose process is gone are dropped
live_holders() {
    local f id
    for f in "$STATE"/holders/*; do
        [[ -e $f ]] || continue
        id=${f##*/}
        if [[ $id =~ ^[0-9]+$ ]] && ! kill -0 "$id" 2>/dev/null; then
            rm -f "$f"
            continue
        fi
        echo "$id"
    done
}

# ----------------------------------------------------------------------------------- installation
install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
        command -v munged >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null || die "SLURM is not installed and apt-get is not available: install ${PACKAGES[*]}"
    say "installing ${PACKAGES[*]} (apt-get)"
    # Keep the packages' own services (systemd units, init scripts) from starting during the install:
    # this script starts the daemons itself, with its own config.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        made_policy=1
    fi
    local rc=0
    {
        apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"
    } >&2 || rc=$?
    [[ $made_policy == 1 ]] && rm -f "$policy"
    [[ $rc == 0 ]] || die "apt-get install ${PACKAGES[*]} failed (exit $rc)"
}

# ------------------------------------------------------------------------------------- loopback
first_ipv4() { getent ahostsv4 "$1" 2>/dev/null | awk 'NR == 1 { print $1 }'; }

ensure_loopback_hostname() {
    local fqdn addr
    fqdn=$(hostname)
    addr=$(first_ipv4 "$fqdn")
    [[ $addr == 127.* ]] && return 0
    if [[ ${LOCAL_SLURM_HOSTS_ENTRY:-0} == 1 ]]; then
        say "pinning $fqdn to 127.0.0.1 in /etc/hosts until stop (it resolved to '${addr:-nothing}')"
        local names=$fqdn
        [[ $NODE != "$fqdn" ]] && names="$fqdn $NODE"
        # prepend: the first matching line wins
        { echo "127.0.0.1 $names $HOSTS_MARK"; cat /etc/hosts; } >"$STATE/hosts.new"
        cat "$STATE/hosts.new" >/etc/hosts # in place: /etc/hosts may be a bind mount
        rm -f "$STATE/hosts.new"
        addr=$(first_ipv4 "$fqdn")
        [[ $addr == 127.* ]] || die "$fqdn still resolves to '$addr' after editing /etc/hosts"
        return 0
    fi
    die "this host's name ($fqdn) resolves to '${addr:-nothing}', not to a loopback address, so the SLURM \
daemons would listen on the network. Run with LOCAL_SLURM_HOSTS_ENTRY=1 to pin $fqdn to 127.0.0.1 in \
/etc/hosts while the cluster runs (stop removes the line)."
}

unpin_hostname() {
    grep -q "$HOSTS_MARK" /etc/hosts 2>/dev/null || return 0
    grep -v "$HOSTS_MARK" /etc/hosts >"$STATE/hosts.new" || true
    cat "$STATE/hosts.new" >/etc/hosts
    rm -f "$STATE/hosts.new"
    say "removed the 127.0.0.1 pin from /etc/hosts"
}

# --------------------------------------------------------------------------------------- config
node_memory_mb() {
    if [[ -n ${LOCAL_SLURM_MEM_MB:-} ]]; then
        echo "$LOCAL_SLURM_MEM_MB"
        return
    fi
    local total_mb headroom
    total_mb=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
    headroom=$((total_mb / 10 > 1024 ? total_mb / 10 : 1024))
    echo $((total_mb - headroom > 256 ? total_mb - headroom : 256))
}

# The CPUs this host gives us. GNU nproc reports OMP_NUM_THREADS instead where it is set (the tests set 1 for
# torch; sites often export it): a node of one CPU would refuse every job asking for more.
host_cpus() { env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc; }

# slurm.conf as this script writes it now, printed (its first line, the mark, carries the time of writing)
slurm_conf() {
    local cpus mem i gres=""
    cpus=${LOCAL_SLURM_CPUS:-$(host_cpus)}
    mem=$(node_memory_mb)
    ((GPUS > 0)) && gres="Gres=gpu:$GPUS "
    cat <<EOF
$MARK ($(date -u +%FT%TZ)); stop restores any previous file.
# A test cluster on loopback: ${#NODES[@]} node(s) on this host, partition cpu, accounting off.
ClusterName=local
SlurmctldHost=$NODE(127.0.0.1)
# bind every daemon and srun to the address the hostname resolves to (checked to be loopback)
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
# Tasks bound to cores (sched_setaffinity) by default, even where Slurm's automatic binding would leave them
# unbound, as on clusters that set TaskPluginParam or a node's CpuBind: a step's task runs on the cores of its
# --cpus-per-task, which srun no longer takes from sbatch's since 22.05 (one when not given). With task/none every
# step ran on all of this host's cores, and no test could see a program pinned to one.
TaskPlugin=task/affinity
TaskPluginParam=Cores
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
# use the node line below even where the hardware reports more (containers)
SlurmdParameters=config_overrides
# finished jobs stay visible to squeue for 5 min: the profile's slurm-status-command is squeue, and
# the plugin switches back to sacct if MinJobAge < 3 x slurm-init-seconds-before-status-checks
MinJobAge=300
KillWait=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$STATE/ctld
# one slurmd per node on this host (slurmd -N <node>): each its own port, spool, pid and log file (%n: node)
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd@%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd@%n.log
$( ((GPUS > 0)) && echo "GresTypes=gpu")
EOF
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[i]} NodeAddr=127.0.0.1 NodeHostname=$NODE Port=$((6818 + i)) CPUs=$cpus RealMemory=$mem ${gres}State=UNKNOWN"
    done
    # cpu: the first node only, so that jobs run two at a time on this host's cores as before; gpu (the cluster
    # profile's GPU partition name): every node, for multi-node requests
    echo "PartitionName=cpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
    echo "PartitionName=gpu Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP"
}

# gres.conf as this script writes it, printed. Stand-in GPUs: SLURM 22.05 drops file-less GPUs from a node's gres,
# so each is a device file that is /dev/null (char 1,3; a plain file where mknod is not allowed, which slurmd logs
# and still counts; write_config makes them). SLURM allocates them per node and sets CUDA_VISIBLE_DEVICES; no
# process can use them as GPUs.
gres_conf() {
    echo "$MARK; stop restores any previous file."
    if ((GPUS > 0)); then echo "Name=gpu File=$STATE/gpu/gpu[0-$((GPUS - 1))]"; fi
}

# whether slurm.conf and gres.conf are what this script writes now, the time of writing aside: not after a change
# to this script or to its settings (LOCAL_SLURM_*), nor where the files are not this script's
config_current() {
    [[ -f $CONF && -f $GRES_CONF ]] && grep -qF "$MARK" "$CONF" || return 1
    [[ $(tail -n +2 "$CONF") == "$(slurm_conf | tail -n +2)" && $(cat "$GRES_CONF") == "$(gres_conf)" ]]
}

write_config() {
    mkdir -p /etc/slurm "$STATE/ctld" "$STATE/spool" "$STATE/log"
    if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF" && [[ ! -f $STATE/slurm.conf.orig ]]; then
        cp -p "$CONF" "$STATE/slurm.conf.orig" # restored by stop
        say "saved the existing $CONF to $STATE/slurm.conf.orig (stop restores it)"
    fi
    if [[ -f $GRES_CONF ]] && ! grep -qF "$MARK" "$GRES_CONF" && [[ ! -f $STATE/gres.conf.orig ]]; then
        cp -p "$GRES_CONF" "$STATE/gres.conf.orig"
        say "saved the existing $GRES_CONF to $STATE/gres.conf.orig (stop restores it)"
    fi
    local i
    for n in "${NODES[@]}"; do mkdir -p "$STATE/spool/$n"; done
    # the nodes are this config's: no state (DRAIN, reasons) carried over from an earlier cluster
    rm -f "$STATE"/ctld/node_state*
    slurm_conf >"$CONF"
    gres_conf >"$GRES_CONF"
    if ((GPUS > 0)); then
        rm -rf "$STATE/gpu" && mkdir -p "$STATE/gpu"
        for ((i = 0; i < GPUS; i++)); do
            mknod "$STATE/gpu/gpu$i" c 1 3 2>/dev/null || touch "$STATE/gpu/gpu$i"
        done
    fi
    say "wrote $CONF (nodes ${NODES[*]}: CPUs=${LOCAL_SLURM_CPUS:-$(host_cpus)}, RealMemory=$(node_memory_mb) MB," \
        "GPUs=$GPUS each; partitions cpu, gpu; tasks bound to their CPUs)"
}

# ---------------------------------------------------------------------------------------- munge
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munged() {
    if our_pid munged >/dev/null; then
        return 0
    fi
    if munge_works; then
        say "munged is already running (not started here): using it"
        return 0
    fi
    local pid
    if pid=$(foreign_pid munged); then
        die "a munged (pid $pid) not started by this script runs but does not answer; stop it first"
    fi
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key; else
            dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
        fi
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    rm -f /run/munge/munged.pid
    # munged forks into the background and writes its pid file
    su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=/run/munge/munged.pid" </dev/null >/dev/null 2>&1 9>&- ||
        die "munged did not start (see /var/log/munge/munged.log)"
    local i
    for ((i = 0; i < 50; i++)); do
        [[ -s /run/munge/munged.pid ]] && break
        sleep 0.1
    done
    tr -dc '0-9' </run/munge/munged.pid >"$STATE/munged.pid"
    our_pid munged >/dev/null || die "munged did not stay up (see /var/log/munge/munged.log)"
    munge_works || die "munged runs but munge -n | unmunge fails (see /var/log/munge/munged.log)"
}

# ------------------------------------------------------------------------------------------ slurm
start_slurm_daemon() { # name (slurmctld, slurmd@<node>) args...
    local name=$1 prog=${1%%@*}
    shift
    our_pid "$name" >/dev/null && return 0
    rm -f "$STATE/$name.pid"
    # both daemonize and write their pid file (SlurmctldPidFile / SlurmdPidFile = $STATE/<name>.pid)
    # (9>&-: the daemon must not inherit the lock)
    "$prog" "$@" </dev/null >>"$STATE/log/$name.stdout" 2>&1 9>&- || die "$name did not start (see $STATE/log/$name.log)"
    local i
    for ((i = 0; i < 100; i++)); do
        our_pid "$name" >/dev/null && return 0
        sleep 0.1
    done
    die "$name did not stay up (see $STATE/log/$name.log)"
}

# "up" when every node of the cluster is idle, mixed or allocated; else the nodes' states
nodes_up() {
    local states up
    states=$(sinfo -h -N -n "$(IFS=,; echo "${NODES[*]}")" -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ')
    up=$(grep -oE '=(idle|mix|alloc) ' <<<"$states" | wc -l)
    if ((up == ${#NODES[@]})); then echo up; else echo "${states:-no answer}"; fi
}

wait_idle() {
    local state="" deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        state=$(nodes_up)
        [[ $state == up ]] && return 0
        sleep 0.5
    done
    say "nodes not idle after ${TIMEOUT}s: $state"
    sinfo -R >&2 2>/dev/null || true
    tail -n 20 "$STATE"/log/slurm*.log >&2 2>/dev/null || true
    return 1
}

all_ours() { # every SLURM daemon of this cluster runs
    local d
    for d in "${DAEMONS[@]:1}"; do our_pid "$d" >/dev/null || return 1; done
}

any_ours() {
    local d
    for d in "${DAEMONS[@]:1}"; do our_pid "$d" >/dev/null && return 0; done
    return 1
}

# -------------------------------------------------------------------------------------- commands
cmd_start() {
    [[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts system daemons)"
    lock 900
    mkdir -p "$STATE/holders"
    touch "$STATE/holders/$HOLDER"
    install_packages
    # a cluster running on another config than this script's now (an older script, other LOCAL_SLURM_*): restarted
    # on this one, unless other holders use it (their jobs would be cancelled)
    if any_ours && ! config_current; then
        local others
        others=$(live_holders | grep -vxF "$HOLDER" | tr '\n' ' ' || true)
        if [[ -n ${others// /} ]]; then
            say "warning: $CONF is not what this script writes now, but holder(s) $others- use the running cluster:" \
                "keeping it (stop --force, then start, to restart it on the new config)"
        else
            say "$CONF is not what this script writes now: restarting the SLURM daemons on the new config"
            stop_slurm
        fi
    fi
    if all_ours && [[ $(nodes_up) == up ]]; then
        say "already running (nodes ${NODES[*]}); holders: $(live_holders | tr '\n' ' ')"
        return 0
    fi
    ensure_loopback_hostname
    # a fresh config only when no daemon of ours runs on the old one
    if ! any_ours; then
        write_config
    fi
    # any failure from here on (die exits) stops what this run started
    trap on_start_failure EXIT
    start_munged
    # checked before any starts: a slurmd just started leaves its daemonizing parent for a moment
    local prog pid
    for prog in slurmctld slurmd; do
        if pid=$(foreign_pid "$prog"); then
            die "a $prog (pid $pid) not started by this script is running: stop it, or use that cluster directly"
        fi
    done
    start_slurm_daemon slurmctld
    for n in "${NODES[@]}"; do start_slurm_daemon "slurmd@$n" -N "$n"; done
    wait_idle || die "the local SLURM did not come up within ${TIMEOUT}s (logs: $STATE/log)"
    trap - EXIT
    say "up: $(sinfo -h -o '%P %a %D %t %N' | tr '\n' ' ')"
}

on_start_failure() {
    local rc=$?
    trap - EXIT
    if [[ $rc != 0 ]]; then
        say "start failed; stopping what was started"
        cmd_stop --locked || true
    fi
    exit "$rc"
}

stop_daemon() {
    local name=$1 pid
    if pid=$(our_pid "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_gone "$pid" 15; then
            say "$name (pid $pid) ignored SIGTERM for 15s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            wait_gone "$pid" 5 || true
        fi
        say "stopped $name (pid $pid)"
    fi
    rm -f "$STATE/$name.pid"
}

# cancel this cluster's jobs, so no slurmstepd or job process outlives slurmd, then stop the SLURM daemons (in
# reverse start order; munged stays)
stop_slurm() {
    if our_pid slurmctld >/dev/null; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
        if [[ -n ${jobs// /} ]]; then
            say "cancelling jobs: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            local i
            for ((i = 0; i < 100; i++)); do
                [[ -z $(squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
                sleep 0.1
            done
        fi
    fi
    local n
    for ((n = ${#DAEMONS[@]} - 1; n >= 1; n--)); do
        stop_daemon "${DAEMONS[n]}"
    done
}

cmd_stop() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    [[ -d $STATE ]] || {
        say "not running (no $STATE)"
        return 0
    }
    # the EXIT trap of a failed start calls this with the lock already held
    [[ ${1:-} == --locked ]] || lock 120
    rm -f "$STATE/holders/$HOLDER"
    local others
    others=$(live_holders | tr '\n' ' ')
    if [[ -n ${others// /} && ${1:-} != --force && ${1:-} != --locked ]]; then
        say "still used by holder(s) $others- leaving it running (stop --force stops it anyway)"
        return 0
    fi
    rm -f "$STATE"/holders/*
    stop_slurm
    stop_daemon munged
    if [[ -f $STATE/slurm.conf.orig ]]; then
        cp -p "$STATE/slurm.conf.orig" "$CONF" && rm -f "$STATE/slurm.conf.orig"
        say "restored the previous $CONF"
    fi
    if [[ -f $STATE/gres.conf.orig ]]; then
        cp -p "$STATE/gres.conf.orig" "$GRES_CONF" && rm -f "$STATE/gres.conf.orig"
        say "restored the previous $GRES_CONF"
    elif grep -qsF "$MARK" "$GRES_CONF"; then
        rm -f "$GRES_CONF"
    fi
    unpin_hostname
}

cmd_status() {
    local name pid rc=0
    [[ -d $STATE/holders ]] && echo "holders: $(live_holders | tr '\n' ' ')"
    for name in "${DAEMONS[@]}"; do
        if pid=$(our_pid "$name"); then
            echo "$name: running (pid $pid)"
        elif [[ $name == munged ]] && munge_works; then
            echo "$name: running (not started by this script)"
        else
            echo "$name: not running"
            rc=3
        fi
    done
    if command -v sinfo >/dev/null && sinfo >/dev/null 2>&1; then
        sinfo
        [[ $(nodes_up) == up ]] || rc=3
    else
        echo "sinfo: no controller answers"
        rc=3
    fi
    return $rc
}

case ${1:-} in
start) cmd_start ;;
stop) cmd_stop "${2:-}" ;;
status) cmd_status ;;
*)
    echo "usage: $0 start | stop [--force] | status" >&2
    exit 2
    ;;
esac
