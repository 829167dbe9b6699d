"""``python -m calibrl.preflight.ray_probe NODES GPUS_PER_NODE``: run inside ``ray_cluster.sh`` by the preflight.
Joins the cluster in ``RAY_ADDRESS`` (with its token), checks that every node of the allocation joined with its
GPUs, and runs one task on each node; exits non-zero naming what is missing."""

from __future__ import annotations

import os
import socket
import sys


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

    hosts = ray.get(
        [
            where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in alive
        ]
    )
    ray.shutdown()
    print(f"Ray: {nodes} node(s) x {per_node} GPU(s), token auth, a task ran on each ({', '.join(sorted(hosts))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
