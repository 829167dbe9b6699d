"""``python -m calibrl.preflight.ray_probe NODES GPUS_PER_NODE``: run inside ``ray_cluster.sh`` by the preflight.
Joins the cluster in ``RAY_ADDRESS`` (with its token), checks that every node of the allocation joined with its
GPUs, runs one task on each node, then starts GPU actors as OpenRLHF's roles are started (``num_gpus=1``, a CPU
each) and runs an all-reduce between them with ``torch.distributed``: NCCL where CUDA is there, gloo otherwise (a
CPU test cluster). A multi-node allocation gets one actor per node, so the all-reduce crosses the nodes as
DeepSpeed's and the weight sync's collectives do; a single node gets two actors on its GPUs. It prints the
collective's bus bandwidth (``nccl-tests``' busbw: algorithm bandwidth x 2(n-1)/n) and exits non-zero naming
what is missing, failed or hung."""

from __future__ import annotations

import os
import socket
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
                "gpus": [str(g) for g in ray.get_gpu_ids()]}  # fmt: skip

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

    # GPU actors: one per node (the collective crosses every node), or two on a single node's GPUs
    places = pin if nodes > 1 else pin * min(2, per_node)
    if len(places) < 2:
        print(f"{line}; one GPU: no all-reduce to run")
        return 0
    actor = ray.remote(num_gpus=1, num_cpus=1)(Rank)
    ranks = [actor.options(scheduling_strategy=s).remote() for s in places]
    try:
        spots = ray.get([r.where.remote() for r in ranks], timeout=COLLECTIVE_TIMEOUT)
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
        f"{r0['device']} correct, bus bandwidth {min(r['busbw_gbs'] for r in results):.2f} GB/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
