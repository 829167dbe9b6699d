"""The GPU layout of one verl run (``grid.models.<model>.resources``; keys and defaults in ``layout.schema.yaml``).

verl 0.9.1 runs one shape, the hybrid engine: the FSDP actor, the reference (with a KL) and the vLLM rollout
replicas share every GPU of the allocation in one resource pool (``trainer.nnodes x trainer.n_gpus_per_node``),
vLLM's tensor-parallel groups tiling those GPUs. DLC's memory network takes a rank on every GPU beside them
(``calibrl.gpu.memory_group``, colocated). A model's DLC runs take the layout with ``resources.dlc`` laid over it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SCHEMA = yaml.safe_load(Path(__file__).with_name("layout.schema.yaml").read_text(encoding="utf-8"))


def effective(resources: dict, dlc: bool) -> dict:
    """The layout of one run: the model's ``resources`` with its ``dlc`` keys laid over them for a DLC run."""
    base = {k: v for k, v in resources.items() if k != "dlc"}
    return {**base, **(resources["dlc"] if dlc else {})}


def gpus(layout: dict) -> int:
    return int(layout["nodes"]) * int(layout["gpus_per_node"])


def slurm_request(layout: dict) -> dict:
    """What rule train asks SLURM for: whole nodes with their GPUs (``--nodes``, ``--gres=gpu[:type]:N``)."""
    kind = f"gpu:{layout['gpu_type']}" if layout.get("gpu_type") else "gpu"
    return {"nodes": int(layout["nodes"]), "gres": f"{kind}:{int(layout['gpus_per_node'])}"}


def problems(grid: dict, runs: list[tuple[str, bool]]) -> list[tuple[str, str]]:
    """(dotted key, what is wrong) for every layout a run of ``runs`` (model, uses DLC) would get that verl cannot
    lay out on the GPUs rule train requests (``grid``: defaults filled)."""
    train = grid["train"]
    batch, group = int(train["prompts_per_step"]), int(train["group_size"])
    mini = batch // int(train["ppo_minibatches"])
    out = []
    for model, dlc in dict.fromkeys(runs):
        resources = grid["models"][model]["resources"]
        key = f"grid.models.{model}.resources" + (".dlc" if dlc and "dlc" in resources else "")
        lay = effective(resources, dlc)
        n, tp, per_node = gpus(lay), int(lay["vllm_tensor_parallel_size"]), int(lay["gpus_per_node"])
        if tp > per_node or per_node % tp:
            out.append((f"{key}.vllm_tensor_parallel_size", f"{tp} does not tile the {per_node} GPUs of a node"))
        # verl splits a step's B x G samples over the data-parallel ranks, and each mini-batch's B/k x G of them
        # (ray_trainer's and the actor's asserts: train_batch_size and ppo_mini_batch_size x n divisible by them)
        if batch * group % n or mini * group % n:
            what = (f"{n} GPUs do not divide a step's {batch * group} samples and an optimizer step's "
                    f"{mini * group} (grid.train.prompts_per_step x group_size, / ppo_minibatches): verl shards both "
                    "over every GPU")  # fmt: skip
            out.append((f"{key}.gpus_per_node", what))
        elif not lay["dynamic_batch"] and mini * group // n % int(lay["micro_train_batch_size"]):
            what = (f"does not divide an optimizer step's {mini * group // n} samples per GPU "
                    "(verl's ppo_micro_batch_size_per_gpu)")  # fmt: skip
            out.append((f"{key}.micro_train_batch_size", what))
        longest = int(train["max_prompt_len"]) + int(train["max_new_tokens"])
        if lay["dynamic_batch"] and int(lay["max_tokens_per_gpu"]) < longest:
            what = f"{lay['max_tokens_per_gpu']} is below one sequence (max_prompt_len + max_new_tokens)"
            out.append((f"{key}.max_tokens_per_gpu", f"{what}, {longest} tokens"))
    return out
