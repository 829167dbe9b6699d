"""``python -m calibrl.preflight.ray_probe NODES GPUS_PER_NODE``: run inside ``ray_cluster.sh`` by the preflight.
Joins the cluster in ``RAY_ADDRESS`` (with its token), checks that every node of the allocation joined with its
GPUs, runs one task on each node, then starts GPU actors as OpenRLHF's roles are started (``num_gpus=1``, a CPU
each) and runs an all-reduce between them with ``torch.distributed``: NCCL where CUDA is there, gloo otherwise (a
CPU test cluster). A multi-node allocation gets one actor per node, so the all-reduce crosses the nodes as
DeepSpeed's and the weight sync's collectives do; a single node gets two actors on its GPUs. Each GPU actor reports
the CPUs it may run on (its affinity), which must not be fewer than :func:`cpus_needed` (a Ray step pinned to one
core starves every actor, engine and grading pool on the node). It prints the collective's bus bandwidth
(``nccl-tests``' busbw: algorithm bandwidth x 2(n-1)/n) and exits non-zero naming what is missing, failed or hung."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

COLLECTIVE_TIMEOUT = 300  # seconds for the actors to start, meet and all-reduce
CUDA_MIB, GLOO_MIB = 256, 4  # the all-reduced tensor (float32)


class Rank:
    """One GPU actor (Ray: ``num_gpus=1``): where it runs, then one process-group rank of the all-reduce."""

    def where(self) -> dict:
        import ray

        sock = socket.socket()
        sock.bind(("", 0))
        port = sock.getsockname()[1]
        sock.close()
        return {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "port": port,
                "gpus": [str(g) for g in ray.get_gpu_ids()],
                # the CPUs this process may run on, the host's, and the SLURM node whose Ray step started it
                "cpus": len(os.sched_getaffinity(0)), "host_cpus": os.cpu_count() or 1,
                "slurm_node": os.environ.get("SLURMD_NODENAME")}  # fmt: skip

    def all_reduce(self, address: str, rank: int, world: int, iters: int = 5) -> dict:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        backend, mib = ("nccl", CUDA_MIB) if cuda else ("gloo", GLOO_MIB)
        if cuda:
            torch.cuda.set_device(0)  # Ray set CUDA_VISIBLE_DEVICES to this actor's GPU
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT // 2)
        dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank, world_size=world, timeout=timeout)
        try:
            x = torch.empty(mib * 2**20 // 4, dtype=torch.float32, device="cuda" if cuda else "cpu")
            want = world * (world + 1) / 2
            seconds = []
            for i in range(iters + 1):  # the first one sets up the communicator
                x.fill_(rank + 1)
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                dist.all_reduce(x)
                if cuda:
                    torch.cuda.synchronize()
                if i:
                    seconds.append(time.perf_counter() - start)
                if not bool((x == want).all()):
                    raise RuntimeError(f"rank {rank}: the all-reduce gave {x[0].item()}, not {want}")
            version = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
            device = torch.cuda.get_device_name(0) if cuda else "cpu"
        finally:
            dist.destroy_process_group()
        best = min(seconds)
        busbw = x.numel() * 4 / best * 2 * (world - 1) / world / 1e9
        return {"backend": backend, "nccl": version, "mib": mib, "seconds": best, "busbw_gbs": busbw, "device": device}


def job_cpus_per_node() -> dict[str, int]:
    """The job's CPUs on each of its nodes, from the controller (``scontrol show job -d``: a ``Nodes=<nodes>
    CPU_IDs=<ids>`` line per group of nodes); empty outside SLURM or where scontrol does not answer."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}

    def scontrol(*args: str) -> str:
        try:
            return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    found = {}
    for nodes, ids in re.findall(r"^\s*Nodes=(\S+) CPU_IDs=([\d,-]+)\s", scontrol("show", "job", "-d", job), re.M):
        count = 0
        for part in ids.split(","):  # e.g. 0-3,8
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
        found.update(dict.fromkeys(scontrol("show", "hostnames", nodes).split(), count))
    return found


def cpus_needed(announced: float, job: int | None, host: int) -> int:
    """The CPUs a GPU actor must be able to run on: as many as Ray announced for its node, at most the job's on
    that node (SLURM) and the host's. Where the job's are unknown (no SLURM, no answer from scontrol), at most 2:
    one core where Ray announced more is the fault this catches for certain (a Ray step bound to the one CPU a
    step gets by default since Slurm 22.05), and never what a site means to give a GPU job."""
    return max(1, min(int(announced), job or 2, host))


def cpu_shortfall(spots: list[dict], announced: list[float], job: dict[str, int]) -> str | None:
    """What the first GPU actor that may run on fewer CPUs than :func:`cpus_needed` saw, with the fix; None if none."""
    for spot, ann in zip(spots, announced, strict=True):
        have = job.get(spot["slurm_node"] or "")
        need = cpus_needed(ann, have, spot["host_cpus"])
        if spot["cpus"] < need:
            node = spot["slurm_node"] or spot["host"]
            return (
                f"a GPU actor on {node} may run on {spot['cpus']} CPU(s) (its affinity, os.sched_getaffinity) where "
                f"Ray announced {ann:g} for the node and the job has {have if have else 'unknown'} there: Ray's "
                f"processes are bound to fewer cores than the job's, so its actors, vLLM engines and grading pools "
                f"share them. ray_cluster.sh gives each Ray step the job's CPUs on its node (--cpus-per-task, "
                f"--cpu-bind=none): check that RAY_SRUN_ARGS does not override them, and the site's binding "
                f"(scontrol show config | grep TaskPlugin; the node's CpuBind)"
            )
    return None


def main(argv: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes, per_node = int(argv[0]), int(argv[1])
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    alive = [n for n in ray.nodes() if n.get("Alive")]
    gpus = sum(n["Resources"].get("GPU", 0) for n in alive)
    if len(alive) != nodes or gpus != nodes * per_node:
        print(f"Ray sees {len(alive)} node(s) with {gpus:g} GPU(s); the job has {nodes} x {per_node}", file=sys.stderr)
        return 1

    @ray.remote(num_cpus=0)
    def where() -> str:
        return socket.gethostname()

    pin = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in alive]
    hosts = ray.get([where.options(scheduling_strategy=s).remote() for s in pin])
    line = f"Ray: {nodes} node(s) x {per_node} GPU(s), token auth, a task ran on each ({', '.join(sorted(hosts))})"

    # GPU actors: one per node (the collective crosses every node), or two on a single node's GPUs (one if it has one)
    on = alive if nodes > 1 else alive * min(2, per_node)
    places = pin if nodes > 1 else pin * min(2, per_node)
    if not places:
        print(f"{line}; no GPU: no GPU actor to start")
        return 0
    actor = ray.remote(num_gpus=1, num_cpus=1)(Rank)
    ranks = [actor.options(scheduling_strategy=s).remote() for s in places]
    try:
        spots = ray.get([r.where.remote() for r in ranks], timeout=COLLECTIVE_TIMEOUT)
        job = job_cpus_per_node()
        short = cpu_shortfall(spots, [n["Resources"].get("CPU", 0) for n in on], job)
        if short:
            print(f"{line}; {short}", file=sys.stderr)
            return 1
        cpus = f"each GPU actor may run on {min(s['cpus'] for s in spots)} CPU(s)"
        known = [job[s["slurm_node"]] for s in spots if s["slurm_node"] in job]
        if known and len(known) == len(spots):
            cpus += f" (the job has {min(known)} on its node)"
        if len(ranks) < 2:
            print(f"{line}; one GPU: no all-reduce to run; {cpus}")
            return 0
        address = f"{spots[0]['ip']}:{spots[0]['port']}"
        refs = [r.all_reduce.remote(address, i, len(ranks)) for i, r in enumerate(ranks)]
        done, waiting = ray.wait(refs, num_returns=len(refs), timeout=COLLECTIVE_TIMEOUT)
        if waiting:
            print(
                f"{line}; the all-reduce between GPU actors on {', '.join(s['host'] for s in spots)} did not finish "
                f"within {COLLECTIVE_TIMEOUT} s (rendezvous at {address}): a collective that hangs here hangs in "
                "training (NCCL_DEBUG=INFO shows which interfaces NCCL chose; NCCL_SOCKET_IFNAME / NCCL_IB_HCA pick "
                "them)",
                file=sys.stderr,
            )
            return 1
        results = ray.get(refs)
    except Exception as exc:
        print(f"{line}; the GPU actors' all-reduce failed: {type(exc).__name__}: {str(exc)[-1500:]}", file=sys.stderr)
        return 1
    finally:
        for r in ranks:
            ray.kill(r)
        ray.shutdown()
    r0 = results[0]
    spread = "across " + ", ".join(s["host"] for s in spots) if nodes > 1 else f"on {spots[0]['host']}"
    what = f"NCCL {r0['nccl']}" if r0["backend"] == "nccl" else "gloo (no CUDA)"
    print(
        f"{line}; {len(ranks)} GPU actors (num_gpus=1) {spread}: {what} all-reduce of {r0['mib']} MiB on "
        f"{r0['device']} correct, bus bandwidth {min(r['busbw_gbs'] for r in results):.2f} GB/s; {cpus}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
