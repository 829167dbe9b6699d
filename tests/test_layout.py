"""Paper-scale GPU layouts (calibrl.backends.openrlhf.layout): what Ray waits for against what rule train requests,
the config check that refuses an unsatisfiable layout by its keys, keys a backend ignores, and the commands
OpenRLHF 0.11.2's own parser takes for each layout of config/paper.yaml."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import filled

from calibrl import grid as G
from calibrl.backends.openrlhf import layout as L
from calibrl.config import problems

ROOT = Path(__file__).resolve().parents[1]
PAPER = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())  # as written: what the checks read
DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
HAVE_OPENRLHF = importlib.util.find_spec("openrlhf") is not None


def _paper(**models) -> dict:
    cfg = copy.deepcopy(PAPER)
    for name, resources in models.items():
        cfg["grid"]["models"][name.replace("_", "-")]["resources"] = resources
    return cfg


def _demand(cfg: dict, run: G.Run) -> tuple[int, dict]:
    lay = G.resources(cfg, run)
    roles = L.run_roles(lay, G.method(cfg, run.method))
    return roles["ray_gpus"], L.slurm_request(lay)


def test_every_paper_run_fits_the_allocation_it_requests():
    assert problems(PAPER) == []
    paper = filled(PAPER)
    seen = {}
    for run in G.runs(paper):
        demand, request = _demand(paper, run)
        gpus = request["nodes"] * int(request["gres"].rsplit(":", 1)[1])
        assert demand <= gpus, run
        assert request == G.request(paper, run)  # what rule train asks SLURM for
        seen[(run.model, G.method(paper, run.method).uses_dlc)] = (demand, request)
    # the hybrid engine takes every GPU of its nodes; DLC's split layout: actor 4 + vLLM 3 + memory 1
    assert seen[("qwen3-14b", False)] == (16, {"nodes": 2, "gres": "gpu:8"})
    assert seen[("qwen3-8b", False)] == (8, {"nodes": 1, "gres": "gpu:8"})
    assert seen[("qwen3-8b", True)] == (8, {"nodes": 1, "gres": "gpu:8"})


def test_the_old_14b_layout_is_refused_with_its_keys_and_numbers():
    """actor 2x8 + reference 4 + vLLM 4 engines x TP2 = 28 GPUs inside 2 nodes of 8: the layout that would
    have made OpenRLHF's placement groups wait forever."""
    split = {"nodes": 2, "gpus_per_node": 8, "actor_gpus_per_node": 8, "ref_gpus_per_node": 4, "vllm_engines": 4}
    found = dict(problems(_paper(qwen3_14b={**split, "vllm_tensor_parallel_size": 2})))
    what = found["grid.models.qwen3-14b.resources"]
    assert "with a KL" in what and "28 GPUs" in what and "actor 16 + ref 4 + vLLM 4x2" in what and "= 16" in what


def test_ray_requests_are_the_placement_groups_openrlhf_creates():
    """Per role, in OpenRLHF's order, a {GPU: 1, CPU: 1} bundle per GPU; the demand the check uses is their sum.
    (tests/test_slurm.py places these very groups in a Ray cluster on a two-node SLURM allocation.)"""

    def groups(cfg, run):
        cfg = filled(cfg, check=False)
        r = L.run_roles(G.resources(cfg, run), G.method(cfg, run.method))
        assert r["ray_gpus"] == sum(b["GPU"] for bundles in r["ray_groups"].values() for b in bundles)
        assert all(b == {"GPU": 1, "CPU": 1} for bundles in r["ray_groups"].values() for b in bundles)
        return {role: len(bundles) for role, bundles in r["ray_groups"].items()}

    assert groups(PAPER, G.Run("qwen3-14b", "grpo", 0)) == {"actor, reference, vLLM (colocated)": 16}
    dlc = G.Run("qwen3-8b", "dapo_iac_dlc", 0)
    assert groups(PAPER, dlc) == {"actor, reference, vLLM (colocated)": 8}  # the memory's ranks inside it
    assert groups(_dlc_split(PAPER), dlc) == {"vLLM": 3, "actor": 4, "DLC memory": 1}
    assert groups(_dlc_split(PAPER, memory_gpus=2), dlc) == {"vLLM": 3, "actor": 4, "DLC memory": 2}
    split = {"nodes": 2, "gpus_per_node": 8, "actor_gpus_per_node": 8, "ref_gpus_per_node": 4, "vllm_engines": 4}
    old = _paper(qwen3_14b={**split, "vllm_tensor_parallel_size": 2})
    assert groups(old, G.Run("qwen3-14b", "grpo", 0)) == {"vLLM": 8, "actor": 16, "reference": 4}


def _dlc_split(config: dict, **more) -> dict:
    """The 8B DLC run on a split layout: vLLM 3 + actor 4 + the memory's GPU(s)."""
    cfg = copy.deepcopy(config)
    dlc = {"colocate_all": False, "actor_gpus_per_node": 4, "vllm_engines": 3, **more}
    cfg["grid"]["models"]["qwen3-8b"]["resources"]["dlc"] = dlc
    return cfg


def test_a_dlc_run_with_a_kl_needs_one_more_gpu():
    cfg = _dlc_split(PAPER)
    cfg["grid"]["methods"]["dapo_iac_dlc"]["dapo"] = False  # a KL now: the reference model is built
    found = dict(problems(cfg))
    what = found["grid.models.qwen3-8b.resources.dlc"]
    assert "a DLC run" in what and "9 GPUs" in what and "ref 1" in what and "DLC memory 1" in what


@pytest.mark.parametrize(
    "change, key, words",
    [
        ({"vllm_engines": 4}, "resources.vllm_engines", "must equal the actor's GPUs"),
        ({"vllm_tensor_parallel_size": 3}, "resources.vllm_tensor_parallel_size", "does not fit"),
        ({"micro_train_batch_size": 48}, "resources.micro_train_batch_size", "do not split"),
        ({"max_tokens_per_gpu": 4096}, "resources.max_tokens_per_gpu", "9216 tokens"),
        ({"segment_steps": 120}, "resources.segment_steps", "multiple of grid.train.eval_every"),
        ({"zero_stage": 4}, "resources.zero_stage", "is not one of"),
        ({"colocate": True}, "resources.colocate", "unknown key"),
    ],
)
def test_each_unsatisfiable_setting_is_named(change, key, words):
    base = PAPER["grid"]["models"]["qwen3-8b"]["resources"]
    found = dict(problems(_paper(qwen3_8b={**base, **change})))
    assert words in found.get(f"grid.models.qwen3-8b.{key}", ""), found


@pytest.mark.parametrize(
    "config, path, value",
    [
        (PAPER, ("warmstart",), {"steps": 1, "batch_size": 1, "lr": 0.1}),
        (PAPER, ("train", "dapo_max_gen_batches"), 5),  # (at its default, 3, it acts no differently: accepted)
        (DEFAULT, ("retention",), {"remove_evaluated": True}),
        (DEFAULT, ("eval", "dtype"), "float32"),
    ],
)
def test_keys_the_chosen_backend_ignores_are_refused(config, path, value):
    cfg = copy.deepcopy(config)
    node = cfg["grid"]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    found = dict(problems(cfg))
    assert "grid." + ".".join(path) in found, found
    assert problems(filled(config)) == []  # a config with its defaults filled in passes again


def test_segments_end_on_checkpoints_and_at_the_last_step():
    run = G.Run("qwen3-8b", "grpo", 0)
    paper = filled(PAPER)
    assert G.segment_ends(paper, run) == list(range(250, 2001, 250))
    assert G.segment_of(paper, run, 50) == 250 and G.segment_of(paper, run, 250) == 250
    assert G.segment_of(paper, run, 300) == 500
    cfg = _paper(qwen3_8b={**PAPER["grid"]["models"]["qwen3-8b"]["resources"], "segment_steps": 750})
    assert G.segment_ends(filled(cfg), run) == [750, 1500, 2000]  # the last one shorter
    cfg["grid"]["models"]["qwen3-8b"]["resources"].pop("segment_steps")
    assert G.segment_ends(filled(cfg), run) == [2000]  # unset: one job


@pytest.mark.skipif(not HAVE_OPENRLHF, reason="openrlhf is not installed (pip install --no-deps openrlhf==0.11.2)")
@pytest.mark.parametrize("model, method", [("qwen3-14b", "grpo"), ("qwen3-8b", "dapo_iac_dlc"), ("qwen3-4b", "iac")])
def test_layouts_become_openrlhf_placements(model, method, tmp_path):
    from conftest import paper_settings

    from calibrl.backends.openrlhf import command, launch

    paper = filled(PAPER)
    settings = paper_settings(paper, G.Run(model, method, 0), tmp_path)
    stamp = json.loads(settings.read_text())
    args = command.check_openrlhf_argv(command.build_command(stamp, settings.parent, tmp_path / "p.jsonl", 40000))
    assert args.train.num_episodes * args.data.max_samples // 64 >= 2000
    assert args.ds.packing_samples and args.train.dynamic_batch_enable
    if model == "qwen3-14b":  # hybrid engine over both nodes, engines of TP 2 covering the 16 GPUs
        assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
        assert (args.actor.num_nodes, args.actor.num_gpus_per_node) == (2, 8) == (args.ref.num_nodes, 8)
        assert args.vllm.num_engines * args.vllm.tensor_parallel_size == 16 and args.ds.zero_stage == 3
        assert args.train.max_tokens_per_gpu == 9216
    elif method == "dapo_iac_dlc":  # the hybrid engine too; the memory's ranks join its placement group
        assert args.train.colocate_all and args.vllm.num_engines == 8 and args.ds.zero_stage == 3
        assert args.algo.kl.init_coef == 0  # DAPO: no reference model
    else:
        assert args.train.colocate_all and args.vllm.num_engines == 8 and args.ds.zero_stage == 2
    with pytest.raises(ValueError, match="STOP_AT 260 must be a checkpoint step"):
        launch.main([str(settings), "260"])  # a segment ends on a checkpoint (here every 50 steps)


def test_the_paper_dag_trains_in_segments_on_the_layouts_request(tmp_path):
    """`snakemake -n --profile slurm --configfile config/paper.yaml` as a user types it: the planner's figures
    first; a 14B checkpoint's evaluation waits for the segment that trains it (and that segment for the one
    before), not for the whole run; each segment asks SLURM for the layout's nodes and GPUs per node."""
    import shutil

    from conftest import copy_workflow, snakemake

    wd = copy_workflow(tmp_path)
    shutil.copytree(ROOT / "slurm", wd / "slurm")
    target = "results/paper/runs/qwen3-14b/grpo/s0/eval/step_300.json"
    out = snakemake(wd, "-n", target, "--profile", "slurm", "--configfile", "config/paper.yaml")
    text = out.stdout + out.stderr
    assert "calibrl plan" in text and "GPU-h" in text and "disk GB" in text
    assert re.search(r"^train\s+158\s+16\s", text, re.M)  # 22 runs in 158 segments, 16 GPUs the largest
    jobs = [block for block in re.split(r"\n(?=rule )", text) if block.startswith("rule train:")]
    ends = sorted(int(re.search(r"end=(\d+)", b)[1]) for b in jobs)
    assert ends == [250, 500]
    assert all("nodes=2" in b and "gres=gpu:8" in b for b in jobs)
    evaluate = next(b for b in re.split(r"\n(?=rule )", text) if b.startswith("rule evaluate:"))
    assert "segment_500.done" in evaluate and "nodes=1" in evaluate and "gres=gpu:8" in evaluate
    metrics = snakemake(
        wd, "-n", "results/paper/runs/qwen3-14b/grpo/s0/metrics.jsonl", "--configfile", "config/paper.yaml"
    )
    assert "segment_2000.done" in metrics.stdout and "rule train_metrics:" in metrics.stdout
