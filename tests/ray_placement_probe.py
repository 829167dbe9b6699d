"""Run by tests/test_slurm.py as ray_cluster.sh's COMMAND inside a multi-node SLURM allocation (Ray's python).

    python ray_placement_probe.py LAYOUTS_JSON OUT_JSON

LAYOUTS_JSON: {name: {"groups": {role: bundles}, "wait_s": seconds}}, the placement groups OpenRLHF 0.11.2 asks
for (calibrl.backends.openrlhf.layout.ray_requests), in its order. Each layout's groups are created one after the
other, as OpenRLHF does (it blocks on each until placed); a group not placed within wait_s stops that layout, and all of
its groups are removed before the next layout. OUT_JSON: the Ray nodes' resources, and per layout and role how
many bundles each node got (None: never placed).
"""

import json
import os
import sys
from collections import Counter

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group


def place(groups: dict, wait_s: float) -> dict:
    made, placed = [], {}
    for role, bundles in groups.items():
        pg = placement_group(bundles, strategy="PACK")
        made.append(pg)
        if not pg.wait(timeout_seconds=wait_s):
            placed[role] = None
            break
        per_node = Counter(placement_group_table(pg)["bundles_to_node_id"].values())
        placed[role] = sorted(per_node.values(), reverse=True)
    for pg in made:
        remove_placement_group(pg)
    return placed


def main(layouts_path: str, out_path: str) -> None:
    layouts = json.loads(open(layouts_path).read())
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    alive = [n for n in ray.nodes() if n.get("Alive")]
    out = {
        "ray_nodes": [{"GPU": n["Resources"].get("GPU", 0), "CPU": n["Resources"].get("CPU", 0)} for n in alive],
        "placed": {name: place(spec["groups"], spec["wait_s"]) for name, spec in layouts.items()},
    }
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
