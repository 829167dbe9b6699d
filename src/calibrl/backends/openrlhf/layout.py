"""The GPU layout of one paper-scale training run (``grid.models.<model>.resources``): where OpenRLHF puts its
roles, how many GPUs Ray waits for, and the SLURM request that gives them. The config check refuses a layout
whose Ray demand exceeds the request (OpenRLHF's placement groups would wait forever), naming the keys.

Two shapes (OpenRLHF 0.11.2, ``cli/train_ppo_ray.py`` L39-105):

* colocated (``colocate_all: true``, the hybrid engine): actor, reference and vLLM engines share every GPU of
  the allocation in one placement group, vLLM and DeepSpeed sleeping in turn. Ray needs ``nodes x
  gpus_per_node`` GPUs, and the engines must cover them exactly (engines x TP == actor GPUs, L56-63).
* split: actor ``nodes x actor_gpus_per_node``, reference ``ref_gpus_per_node`` on one node (built only when
  a KL is used, L93), engines ``vllm_engines x vllm_tensor_parallel_size``; each role on GPUs of its own.

DLC's memory network is a group of ranks (``memory_group``): colocated, one in each bundle of the shared
placement group (a share of every GPU, no GPU more); split, ``memory_gpus`` GPUs in a group of its own. A model's
DLC runs take the layout with the keys of ``resources.dlc`` laid over it. Its keys and defaults are
``layout.schema.yaml`` beside this file (:data:`SCHEMA`, the config schema's ``$defs/layout`` for this backend);
``vllm_engines`` and ``actor_gpus_per_node``, unset, follow from the layout's kind
(:func:`roles`), as their schema descriptions say.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from calibrl.spec import MethodSpec

SCHEMA = yaml.safe_load(Path(__file__).with_name("layout.schema.yaml").read_text(encoding="utf-8"))


def effective(resources: dict, dlc: bool) -> dict:
    """The layout of one run: the model's ``resources`` with its ``dlc`` keys laid over them for a DLC run."""
    base = {k: v for k, v in resources.items() if k != "dlc"}
    return {**base, **(resources["dlc"] if dlc else {})}


def roles(layout: dict, kl: bool, dlc: bool) -> dict:
    """OpenRLHF's placement (``command.build_command``'s ``resources``) and what Ray will wait for."""
    nodes, per_node, tp = int(layout["nodes"]), int(layout["gpus_per_node"]), int(layout["vllm_tensor_parallel_size"])
    # Unset, actor_gpus_per_node and vllm_engines follow from the layout's kind (their schema descriptions say so).
    if layout["colocate_all"]:
        engines = int(layout["vllm_engines"]) if "vllm_engines" in layout else nodes * per_node // tp
        actor, ref = per_node, per_node  # OpenRLHF asserts ref == actor when colocated (L42-46)
    else:
        actor = int(layout["actor_gpus_per_node"]) if "actor_gpus_per_node" in layout else per_node
        ref = int(layout["ref_gpus_per_node"])
        engines = int(layout["vllm_engines"]) if "vllm_engines" in layout else 1
    knobs = {
        k: v for k, v in layout.items() if k not in ("nodes", "gpus_per_node", "vllm_engines", "dlc", "memory_gpus")
    }
    placement = {
        **knobs,
        "actor_nodes": nodes,
        "actor_gpus_per_node": actor,
        "ref_nodes": nodes if layout["colocate_all"] else 1,
        "ref_gpus_per_node": ref,
        "vllm_engines": engines,
    }
    memory = (nodes * actor if layout["colocate_all"] else int(layout["memory_gpus"])) if dlc else 0
    groups = ray_requests(placement, bool(layout["colocate_all"]), kl, memory)
    return {
        "resources": placement,
        "ray_groups": groups,
        "ray_gpus": sum(b["GPU"] for bundles in groups.values() for b in bundles),
        "actor_gpus": nodes * actor,
        "memory_ranks": memory,
    }


def run_roles(layout: dict, spec: MethodSpec) -> dict:
    """:func:`roles` for one run: its method's spec decides the reference model (a KL term) and DLC's memory actor."""
    return roles(layout, spec.uses_kl, spec.uses_dlc)


def ray_requests(placement: dict, colocated: bool, kl: bool, memory: int) -> dict[str, list[dict]]:
    """What OpenRLHF 0.11.2 asks Ray for, per role: the bundles of its placement group, each ``{"GPU": 1,
    "CPU": 1}`` (a lone one-GPU actor's request counted as one bundle). Colocated, one group of the actor's GPUs
    holds actor, reference and engines (``cli/train_ppo_ray.py`` L39-52); split, the actor's, the reference's
    (with a KL) and the engines' groups are separate (``trainer/ray/launcher.py`` L243-251,
    ``trainer/ray/vllm_engine.py`` L246-250). DLC's ``memory`` ranks: colocated, inside the shared group's
    bundles (nothing more); split, a group of their own (``memory_group``). A group is placed only once Ray has
    all its bundles free (PACK: on as few nodes as it can); a demand beyond the allocation is never placed, and
    OpenRLHF waits on it forever. Ray must announce a CPU per GPU on every node (``ray_cluster.sh`` refuses
    fewer)."""
    one = {"GPU": 1, "CPU": 1}
    actor = placement["actor_nodes"] * placement["actor_gpus_per_node"]
    if colocated:
        groups = {"actor, reference, vLLM (colocated)": [one] * actor}
    else:  # in the order OpenRLHF creates them, each waiting until placed
        groups = {"vLLM": [one] * (placement["vllm_engines"] * int(placement["vllm_tensor_parallel_size"]))}
        groups["actor"] = [one] * actor
        if kl:
            groups["reference"] = [one] * (placement["ref_nodes"] * placement["ref_gpus_per_node"])
    if memory and not colocated:
        groups["DLC memory"] = [one] * memory
    return groups


def slurm_request(layout: dict) -> dict:
    """What rule train asks SLURM for: whole nodes with their GPUs (``--nodes``, ``--gres=gpu[:type]:N``)."""
    kind = f"gpu:{layout['gpu_type']}" if layout.get("gpu_type") else "gpu"
    return {"nodes": int(layout["nodes"]), "gres": f"{kind}:{int(layout['gpus_per_node'])}"}


def problems(grid: dict, runs: list[tuple[str, bool, bool]]) -> list[tuple[str, str]]:
    """(dotted key, what is wrong) for every layout a run of ``runs`` (model, uses a KL, uses DLC) would get
    that Ray or DeepSpeed cannot satisfy inside the allocation rule train requests (``grid``: defaults filled)."""
    train = grid["train"]
    samples = int(train["prompts_per_step"]) * int(train["group_size"])
    per_update = samples // int(train["ppo_minibatches"])  # DeepSpeed's train_batch_size (command.train_samples)
    out = []
    for model, kl, dlc in dict.fromkeys(runs):
        resources = grid["models"][model]["resources"]
        key = f"grid.models.{model}.resources" + (".dlc" if dlc and "dlc" in resources else "")
        lay = effective(resources, dlc)
        r = roles(lay, kl, dlc)
        have = int(lay["nodes"]) * int(lay["gpus_per_node"])
        tp, per_node = int(lay["vllm_tensor_parallel_size"]), int(lay["gpus_per_node"])
        who = ("a DLC run" if dlc else "a run") + (
            " with a KL (no dapo, grid.train.kl_coef > 0: the reference model is built)" if kl else " without a KL"
        )
        if r["ray_gpus"] > have:
            what = (
                f"{who} makes Ray wait for {r['ray_gpus']} GPUs ({_spell(r, lay, kl, dlc)}), but rule train requests "
                f"nodes x gpus_per_node = {have}; OpenRLHF's placement groups would wait forever"
            )
            out.append((key, what))
        if tp > per_node or (lay["colocate_all"] and per_node % tp):
            out.append((f"{key}.vllm_tensor_parallel_size", f"{tp} does not fit the {per_node} GPUs of a node"))
        engines = r["resources"]["vllm_engines"]
        if lay["colocate_all"] and engines * tp != r["actor_gpus"]:
            what = f"colocated: vllm_engines x vllm_tensor_parallel_size ({engines * tp}) must equal the actor's GPUs"
            out.append((f"{key}.vllm_engines", what + f" ({r['actor_gpus']}; OpenRLHF L56-63)"))
        micro = int(lay["micro_train_batch_size"])
        if per_update % (r["actor_gpus"] * micro):
            what = (
                f"an optimizer step's {per_update} samples (grid.train.prompts_per_step x group_size / "
                f"ppo_minibatches) do not split into {r['actor_gpus']} actor GPUs x micro_train_batch_size {micro} "
                "(DeepSpeed's train_batch_size)"
            )
            out.append((f"{key}.micro_train_batch_size", what))
        longest = int(train["max_prompt_len"]) + int(train["max_new_tokens"])
        if lay["dynamic_batch"] and int(lay["max_tokens_per_gpu"]) < longest:
            what = f"{lay['max_tokens_per_gpu']} is below one sequence (max_prompt_len + max_new_tokens)"
            out.append((f"{key}.max_tokens_per_gpu", f"{what}, {longest} tokens"))
        if samples // int(lay["micro_rollout_batch_size"]) < r["actor_gpus"]:
            what = f"fewer rollout micro-batches than the {r['actor_gpus']} actor GPUs (OpenRLHF's last assertion)"
            out.append((f"{key}.micro_rollout_batch_size", what))
    return out


def _spell(r: dict, lay: dict, kl: bool, dlc: bool) -> str:
    res = r["resources"]
    if lay["colocate_all"]:
        parts = [f"colocated actor/ref/vLLM {r['actor_gpus']}"]
    else:
        parts = [f"actor {r['actor_gpus']}"] + ([f"ref {res['ref_gpus_per_node']}"] if kl else [])
        parts.append(f"vLLM {res['vllm_engines']}x{res['vllm_tensor_parallel_size']}")
    extra = [f"DLC memory {r['memory_ranks']}"] if dlc and not lay["colocate_all"] else []
    return " + ".join(parts + extra)
