"""The planner (``calibrl plan``): sizes from the Qwen3 configs, totals that are sums, costs that scale with
steps and samples, and SLURM runtimes checked against the per-job estimates."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from conftest import filled

from calibrl import grid as G
from calibrl import plan as P
from calibrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAPER = filled("paper")
BASES = sum(len(G.base_seeds(PAPER, m)) for m in PAPER["grid"]["models"])  # rule evaluate_base: one per seed


def _rows(config, **overrides):
    rows, trains = P.plan(filled(config), overrides)
    return {r.rule: r for r in rows}, trains


@pytest.mark.parametrize("hf_id", ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B"])
def test_parameter_counts_are_those_of_the_real_model_class(hf_id):
    """The formula against transformers' Qwen3ForCausalLM built (on the meta device) from the same config."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = P.QWEN3[hf_id]
    config = Qwen3Config(
        vocab_size=P.VOCAB,
        hidden_size=c["hidden"],
        intermediate_size=c["inter"],
        num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        head_dim=P.HEAD_DIM,
        tie_word_embeddings=c["tied"],
    )
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    real = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    assert P.parameters(hf_id) == real
    assert P.kv_bytes_per_token(hf_id) == 2 * c["layers"] * c["kv_heads"] * 128 * 2


def test_the_paper_grid_is_planned_rule_by_rule():
    rows, trains = _rows(PAPER)
    assert list(rows) == ["data_download", "download_model", "rank_train", "train", "evaluate", "aggregate"]
    assert rows["data_download"].jobs == 7  # DeepScaleR + six benchmarks
    assert rows["download_model"].jobs == 4  # 4B, 8B, 14B and DLC's 1.7B memory
    assert rows["rank_train"].jobs == 1  # only qwen3-8b runs the filtering baseline
    # runs in segments of 500 (4B) / 250 steps (the 8B's DLC run 200: its generation runs in waves)
    assert len(trains) == 22 and rows["train"].jobs == 5 * 4 + 16 * 8 + 10
    assert rows["evaluate"].jobs == 880 + BASES  # 22 runs x 40 checkpoints, and the base models at step 0
    # model downloads: the four checkpoints in bf16, from the configs' parameter counts
    ids = ["Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-1.7B"]
    assert rows["download_model"].disk_gb == pytest.approx(sum(P.parameters(i) * 2 for i in ids) / 1e9)
    # an 8B run keeps its newest HF checkpoint and a segment's 5 awaiting evaluation (8.19e9 x 2 bytes each;
    # grid.retention removes the evaluated ones) and the two DeepSpeed states OpenRLHF keeps (--ckpt.max_num 2,
    # 14 bytes per parameter each); no final model (launch.skip_final_save)
    n8 = P.parameters("Qwen/Qwen3-8B")
    grpo8 = next(t for t in trains if t.note.startswith("qwen3-8b/grpo/"))
    assert grpo8.disk_gb == pytest.approx(n8 * (6 * 2 + 2 * 14) / 1e9)
    keep_all = copy.deepcopy(PAPER)
    keep_all["grid"]["retention"]["remove_evaluated"] = False
    grpo8_all = next(t for t in P.plan(keep_all)[1] if t.note.startswith("qwen3-8b/grpo/"))
    assert grpo8_all.disk_gb == pytest.approx(n8 * (40 * 2 + 2 * 14) / 1e9)
    # DLC: the memory's weights in each engine checkpoint and its optimizer state beside each DeepSpeed state; its
    # segments of 200 steps leave 4 copies awaiting evaluation beside the newest
    n17 = P.parameters("Qwen/Qwen3-1.7B")
    dlc8 = next(t for t in trains if t.note.startswith("qwen3-8b/dapo_iac_dlc/"))
    assert dlc8.disk_gb == pytest.approx((n8 * (5 * 2 + 2 * 14) + n17 * (5 * 2 + 2 * 12)) / 1e9)
    assert grpo8.jobs == 8 and grpo8.job_h < 48 and grpo8.wall_h > 48  # each segment fits a 48 h limit
    assert grpo8.gpus == 8 and next(t for t in trains if "qwen3-14b" in t.note).gpus == 16
    # DLC and DAPO cost more than the plain run on the same model
    dlc = next(t for t in trains if "dapo_iac_dlc" in t.note)
    dapo = next(t for t in trains if t.note.startswith("qwen3-8b/dapo/"))
    assert dlc.wall_h > dapo.wall_h > grpo8.wall_h
    # DLC colocated (docs/cluster.md "DLC"): its composite engines hold ~55% of a step's sequences in their KV
    # cache, so generation runs in 1.83 waves (test_dlc_rollout_is_priced_by_its_engines_kv_capacity): 1.77x
    # DAPO+IAC's GPU-hours. Its compute alone (a KV cache that held the batch) is issue 26's 1.30x at the H100's
    # measured memory efficiency 0.57, above the 1.21x of the memory's update hidden; with its segments of 200 steps
    # (two more job starts) that bar holds at 0.57 and breaks below 0.55 (0.45: the toy-size CPU figure)
    dapo_iac = next(t for t in trains if t.note.startswith("qwen3-8b/dapo_iac/"))
    assert 1.7 < dlc.gpu_hours / dapo_iac.gpu_hours < 1.85 and "1.83 waves" in dlc.note
    fits = {"kv_resident_fraction": 0.5}  # 64 x 3,067 x 0.5 = 98k tokens an engine: the batch fits its 107k
    for efficiency, within in ((0.57, True), (0.55, False), (0.45, False)):
        plan = P.plan(PAPER, {"memory_update_efficiency": efficiency, **fits})[1]
        other = next(t for t in plan if t.note.startswith("qwen3-8b/dapo_iac_dlc/"))
        assert "waves" not in other.note
        assert (other.gpu_hours <= 1.3 * dapo_iac.gpu_hours) is within, efficiency
        assert other.gpu_hours > 1.21 * dapo_iac.gpu_hours


def test_dlc_rollout_is_priced_by_its_engines_kv_capacity():
    """The paper's DLC layout (Qwen3-8B + Qwen3-1.7B in one composite vLLM engine per H100, TP 1, 0.6 of its memory):
    the KV cache left beside both models' weights, by hand, holds ~55% of an engine's share of a step (64 sequences
    at the mean length), so its generation runs in waves, each ending in its own long tail, and the preempted
    sequences prefill again; the policy alone fits in one (issue 43, N3)."""
    a = P.assumptions()
    policy, memory = "Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B"
    # 85.0 GB (79.19 GiB) x 0.6, less 3 GB beside the cache, less bf16 weights of 8,190,735,360 + 1,720,574,976
    # parameters; a token's K and V: 2 x 36 layers x 8 heads x 128 x 2 B + 2 x 28 x 8 x 128 x 2 B
    by_hand = ((85.0 * 0.6 - 3.0) * 1e9 - 2 * (8_190_735_360 + 1_720_574_976)) / (147_456 + 114_688)
    assert round(by_hand) == 107_488
    assert P.kv_capacity_tokens(a, [policy, memory], 0.6) == pytest.approx(by_hand)
    assert P.kv_capacity_tokens(a, [policy], 0.6) == pytest.approx(((51.0 - 3.0) * 1e9 - 2 * 8_190_735_360) / 147_456)
    # tensor parallelism: the budget of both GPUs, the weights once
    assert P.kv_capacity_tokens(a, [policy], 0.6, tp=2) == pytest.approx((2 * 48e9 - 2 * 8_190_735_360) / 147_456)
    # a step: 64 prompts x 8 samples over 8 engines, each sequence 200 + 0.35 x 8,192 tokens
    waves = 64 * (200 + 0.35 * 8192) / by_hand
    assert waves == pytest.approx(1.826, abs=1e-3)
    assert P.generation_waves(a, [policy, memory], 64, 8192, 0.6) == pytest.approx(waves)
    assert P.generation_waves(a, [policy], 64, 8192, 0.6) == 1.0  # 196k tokens in 214k: one wave
    with pytest.raises(ValueError, match="holds no KV cache beside the weights"):
        P.generation_waves(a, [policy, memory], 64, 8192, 0.2)
    # priced: the same tokens decoded; the preempted share prefills its mean context again; a tail per wave
    composite = P.parameters(policy) + P.parameters(memory)
    one = P.generation_seconds(a, policy, 512, 8192, 8, 1, memory)
    dlc = P.generation_seconds(a, policy, 512, 8192, 8, 1, memory, waves)
    refill = (1 - 1 / waves) * 512 * (200 + 0.35 * 8192 / 2) * 2 * composite / (0.3 * 989e12) / 8
    assert dlc - one == pytest.approx((waves - 1) * P.tail_seconds(a, composite, 8192) + refill)
    plain = P.generation_seconds(a, policy, 512, 8192, 8)
    assert one / plain == pytest.approx(1.32, abs=0.01)  # the composite's compute and KV reads alone
    assert dlc / plain == pytest.approx(2.07, abs=0.01)  # with its waves: the paper reports 5x
    # in the plan: the DLC run's step generates in those waves, the policy's runs in one
    _, trains = P.plan(PAPER)
    step = {t.note.split(":")[0]: t.note for t in trains}
    assert "in 1.83 waves" in step["qwen3-8b/dapo_iac_dlc/s0"] and "waves" not in step["qwen3-8b/dapo_iac/s0"]
    assert f"a step {1.5 * dlc:.0f} s generation" in step["qwen3-8b/dapo_iac_dlc/s0"]  # DAPO's refills: 1.5x
    assert f"a step {1.5 * plain:.0f} s generation" in step["qwen3-8b/dapo_iac/s0"]


def test_generation_has_a_long_tail():
    """One response at the 8,192-token budget decodes alone at the end of a step for 60-100 s on an H100 (8B): the
    batch's throughput does not cover it, so a step with few sequences costs at least that."""
    a = P.assumptions()
    tail = P.tail_seconds(a, P.parameters("Qwen/Qwen3-8B"), 8192)
    assert 60 < tail < 100
    assert P.tail_seconds(a, P.parameters("Qwen/Qwen3-8B"), 8192, tp=2) == pytest.approx(tail / 2)
    assert P.generation_seconds(a, "Qwen/Qwen3-8B", 1, 8192, 8) > tail


def test_totals_are_sums_of_the_rules():
    rows, trains = P.plan(PAPER)
    by = {r.rule: r for r in rows}
    t = P.totals(rows, trains)
    assert t["gpu_hours"] == pytest.approx(sum(r.gpu_hours for r in rows))
    assert t["disk_gb"] == pytest.approx(sum(r.disk_gb for r in rows))
    assert by["train"].gpu_hours == pytest.approx(sum(tr.gpu_hours for tr in trains))
    assert by["train"].disk_gb == pytest.approx(sum(tr.disk_gb for tr in trains))
    assert by["train"].wall_h == max(tr.job_h for tr in trains)  # a job is a segment
    # a run's segments follow one another: the path holds the longest run, not one segment
    longest = max(tr.wall_h for tr in trains)
    assert t["critical_path_h"] == pytest.approx(sum(r.wall_h for r in rows) - by["train"].wall_h + longest)
    # every evaluation of one model costs the same: the summed GPU-hours are per-model job counts x wall
    assert by["evaluate"].gpu_hours <= by["evaluate"].jobs * by["evaluate"].wall_h * by["evaluate"].gpus


def test_costs_scale_with_steps_and_samples():
    a = P.assumptions()
    base, base_trains = _rows(PAPER)
    longer = copy.deepcopy(PAPER)
    longer["grid"]["train"]["steps"] = 4000
    rows, trains = _rows(longer)
    # what an evaluation job spends whatever its size: engine start-up and the long tail (the longest job: 14B)
    big = "Qwen/Qwen3-14B"
    startup = (P.startup_seconds(a, big) + P.tail_seconds(a, P.parameters(big), 8192)) / 3600
    for b, t in zip(base_trains, trains):  # twice the steps (in more segments, each starting its engines)
        model = {"qwen3-4b": "Qwen/Qwen3-4B", "qwen3-8b": "Qwen/Qwen3-8B", "qwen3-14b": big}[t.note.split("/")[0]]
        per_job = P.startup_seconds(a, model, *(["Qwen/Qwen3-1.7B"] if "dlc" in t.note else [])) / 3600
        assert t.wall_h - t.jobs * per_job == pytest.approx(2 * (b.wall_h - b.jobs * per_job))
        assert 2 * b.jobs - 1 <= t.jobs <= 2 * b.jobs  # 2000 = 13 x 150 + 50, 4000 = 26 x 150 + 100
    assert rows["evaluate"].jobs - BASES == 2 * (base["evaluate"].jobs - BASES)  # twice the checkpoints
    more = copy.deepcopy(PAPER)
    more["grid"]["eval"]["n"] = 16
    rows, _ = _rows(more)
    assert rows["evaluate"].wall_h - startup == pytest.approx(2 * (base["evaluate"].wall_h - startup))
    assert rows["train"].gpu_hours == pytest.approx(base["train"].gpu_hours)  # training untouched
    # data-parallel evaluation engines divide the wall time, not the GPU-hours (up to the start-up)
    one = copy.deepcopy(PAPER)
    one["grid"]["eval"]["data_parallel_size"] = 1
    rows, _ = _rows(one)
    assert base["evaluate"].gpus == 8 and rows["evaluate"].gpus == 1
    assert rows["evaluate"].wall_h - startup == pytest.approx(8 * (base["evaluate"].wall_h - startup))
    # a measured throughput replaces the formula for that model
    fast, _ = _rows(
        PAPER,
        **{
            "gen_tokens_per_s.Qwen/Qwen3-14B": 1e9,
            "gen_tokens_per_s.Qwen/Qwen3-8B": 1e9,
            "gen_tokens_per_s.Qwen/Qwen3-4B": 1e9,
        },
    )
    assert fast["evaluate"].gpu_hours < base["evaluate"].gpu_hours / 5
    with pytest.raises(ValueError, match="unknown planner assumption 'gpu_tflops'"):
        P.plan(PAPER, {"gpu_tflops": 1})


def test_slurm_runtimes_are_checked_against_the_estimates(tmp_path):
    rows, _ = P.plan(PAPER)
    by = {r.rule: r for r in rows}
    runtimes = P.slurm_runtimes(ROOT / "slurm" / "config.yaml")
    assert runtimes["evaluate"] > 0 and "*" in runtimes
    margin = P.ASSUMPTIONS["runtime_margin"][0]
    generous = {rule: by[rule].wall_h * margin * 60 + 1 for rule in by} | {"*": 1e9}
    assert P.check_runtimes(rows, generous) == []
    tight = {**generous, "evaluate": by["evaluate"].wall_h * 60 * 1.2}  # fits the estimate, not its margin
    (warning,) = P.check_runtimes(rows, tight)
    assert warning.startswith("WARNING evaluate:") and "set-resources.evaluate.runtime" in warning
    assert P.check_runtimes(rows, tight, {"runtime_margin": 1.1}) == []
    # the default runtime covers rules the profile does not name
    assert len(P.check_runtimes(rows, {"*": 0.001})) == sum(r.wall_h > 0 for r in rows)


def test_gpu_requests_of_the_vllm_rules_are_checked():
    # the rules request their GPUs from the config; a `gpu` in the profile would replace that request
    assert P.slurm_gpus(ROOT / "slurm" / "config.yaml") == {}
    assert P.check_gpus(PAPER, {"evaluate": 8, "rank_train": 8}) == []  # 8 engines on 8 GPUs
    assert len(P.check_gpus(PAPER, {"evaluate": 1})) == 1
    dp = copy.deepcopy(PAPER)
    dp["grid"]["eval"].update(data_parallel_size=4, tensor_parallel_size=2)
    warnings = P.check_gpus(dp, {"evaluate": 8, "rank_train": 1})
    assert len(warnings) == 1 and "set-resources.rank_train.gpu" in warnings[0] and "asks for 8 GPUs" in warnings[0]


def test_the_plan_command(tmp_path, capsys):
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"set-resources": {"evaluate": {"runtime": 1}}}))
    assumptions = tmp_path / "a.yaml"
    assumptions.write_text("train_mfu: 0.5\n")
    args = ["plan", "--configfile", str(ROOT / "config" / "paper.yaml"), "--profile", str(profile)]
    assert main([*args, "--assumptions", str(assumptions), "--assume", "gen_mfu=0.2"]) == 0
    out = capsys.readouterr().out
    assert "evaluate" in out and str(880 + BASES) in out and "total" in out
    assert "train_mfu = 0.5" in out and "gen_mfu = 0.2" in out
    assert "WARNING evaluate" in out and "WARNING train" not in out
    assert "NOTE models without a pinned revision" in out and "'qwen3-1.7b'" in out
    assert main([*args, "--assume", "gen_mfu"]) == 2
    assert "expected name=value" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ packing onto nodes
SMOKE = filled("cluster_smoke")


@pytest.fixture
def in_repo(monkeypatch):
    """`--profile slurm` (and slurm/smoke's base, slurm/config.yaml) are found from the checkout's root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("CALIBRL_SMOKE_BASE", raising=False)


def _priced(config, *profiles, **overrides):
    requests = P.slurm_requests(P.read_profile(*profiles)) if profiles else None
    rows, trains = P.plan(config, overrides, requests)
    return {r.rule: r for r in rows}, P.totals(rows, trains)


@pytest.mark.usefixtures("in_repo")
def test_the_smoke_run_packs_as_priced_only_with_its_profile_layer():
    """slurm/config.yaml alone gives every smoke training job the paper's 64 CPUs and 900 GB: one holds a whole
    node (8 GPUs for its 2), and the wall time on 8 GPUs is at least twice the one with slurm/smoke, where 4 runs
    share a node as the GPUs allow."""
    alone, t_alone = _priced(SMOKE, "slurm")
    layered, t_layered = _priced(SMOKE, "slurm", "slurm/smoke")
    assert t_alone["gpu_hours"] == pytest.approx(t_layered["gpu_hours"])  # the same work
    assert t_alone["on_gpus_h"] >= 2 * t_layered["on_gpus_h"], (t_alone, t_layered)
    assert alone["train"].per_node == "1 per node (by CPUs)" and alone["train"].held_gpus == 8
    assert layered["train"].per_node == "4 per node (by GPUs)" and layered["train"].held_gpus == 2
    assert layered["evaluate"].per_node == "8 per node (by GPUs)"
    assert t_layered["held_gpu_hours"] == pytest.approx(t_layered["gpu_hours"])  # nothing left idle
    # the layer's sizes fill a node of 8 GPUs, 64 CPUs and 480 GB exactly: 4 runs or 8 evaluations
    small = {"node_cpus": 64, "node_mem_mb": 480_000}
    small_rows, t_small = _priced(SMOKE, "slurm", "slurm/smoke", **small)
    assert small_rows["train"].per_node == "4 per node (by GPUs and CPUs and memory)"
    assert small_rows["evaluate"].per_node == "8 per node (by GPUs and CPUs and memory)"
    assert t_small["on_gpus_h"] == pytest.approx(t_layered["on_gpus_h"])
    # without a profile GPUs alone count (snakemake -n's plan, and a checkout without slurm/)
    bare, t_bare = _priced(SMOKE)
    assert bare["train"].held_gpus == 2 and t_bare["on_gpus_h"] == pytest.approx(t_layered["on_gpus_h"])
    # the paper's jobs hold whole nodes anyway: its price is unchanged by the profile
    _, t_paper = _priced(PAPER, "slurm")
    assert t_paper["held_gpu_hours"] == pytest.approx(t_paper["gpu_hours"])


@pytest.mark.usefixtures("in_repo")
def test_the_smoke_layer_replaces_only_its_sizes_and_snakemake_reads_it_so(tmp_path, monkeypatch):
    """Snakemake replaces a whole top-level key per later profile; slurm/smoke (a YTE template) rebuilds
    set-resources from slurm/config.yaml, so every partition and every other rule's values are the base's."""
    from snakemake.cli import parse_args

    base = P.read_profile("slurm")
    merged = P.read_profile("slurm", "slurm/smoke")
    others = {k: v for k, v in base.items() if k != "set-resources"}
    assert {k: v for k, v in merged.items() if k != "set-resources"} == others  # every other key: the base's
    sized = {"train", "evaluate", "evaluate_base", "rank_train", "preflight"}
    assert set(merged["set-resources"]) == set(base["set-resources"]) | sized
    for rule, res in merged["set-resources"].items():
        own = base["set-resources"].get(rule, {})
        changed = {k for k in res if own.get(k) != res[k]}
        assert changed <= ({"cpus_per_task", "mem_mb", "runtime"} if rule in sized else set()), (rule, changed)
    sizes = {"cpus_per_task": 16, "mem_mb": 120000, "runtime": 60}
    assert merged["set-resources"]["train"] == {**base["set-resources"]["train"], **sizes}
    # what Snakemake 9 itself makes of the two layers
    _, args = parse_args(["--profile", "slurm", "--profile", "slurm/smoke", "-n"])
    for rule, res in merged["set-resources"].items():
        for key in ("cpus_per_task", "mem_mb", "runtime"):
            if key in res:
                assert args.set_resources[rule][key].value == res[key], (rule, key)
    assert args.executor == "slurm" and args.retries == 2  # the base's other keys still apply
    # the planner reads the same requests from Snakemake's parsed resources (workflow.resource_settings) as from files
    parsed = {"set-resources": args.set_resources, "default-resources": args.default_resources}
    assert P.slurm_requests(parsed) == P.slurm_requests(merged) and P.slurm_runtimes(parsed) == P.slurm_runtimes(merged)
    # a site that keeps its values in a layer of its own names it as the base
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"set-resources": {"train": {"slurm_partition": "h100", "cpus_per_task": 96}}}))
    monkeypatch.setenv("CALIBRL_SMOKE_BASE", str(site))
    train = P.read_profile("slurm", "slurm/smoke")["set-resources"]["train"]
    assert train == {"slurm_partition": "h100", "cpus_per_task": 16, "mem_mb": 120000, "runtime": 60}
    monkeypatch.setenv("CALIBRL_SMOKE_BASE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="layers on .*missing.yaml"):
        P.read_profile("slurm", "slurm/smoke")


def test_a_job_larger_than_a_node_is_a_problem_naming_the_key(tmp_path, capsys):
    profile = {"set-resources": {"train": {"cpus_per_task": 200, "mem_mb": 900000}}, "default-resources": {}}
    (problem,) = P.check_nodes(PAPER, P.slurm_requests(profile))
    assert problem.startswith("PROBLEM train: set-resources.train.cpus_per_task = 200 CPUs per node")
    assert "a node has 112" in problem and "--assume node_cpus=N" in problem
    rows, _ = P.plan(PAPER, requests=P.slurm_requests(profile))
    assert next(r for r in rows if r.rule == "train").per_node == "fits no node (see the problems below)"
    # memory, from default-resources where a rule has no value of its own
    big = {"set-resources": {"train": {"cpus_per_task": 8}}, "default-resources": {"mem_mb": 3_000_000}}
    problems = P.check_nodes(PAPER, P.slurm_requests(big))
    assert any("PROBLEM evaluate: default-resources.mem_mb = 3e+06 MB per node" in p for p in problems), problems
    assert not any("cpus_per_task" in p for p in problems)
    # GPUs: the layouts' gpus_per_node and grid.eval's engines against a node of 4
    problems = P.check_nodes(PAPER, None, {"node_gpus": 4})
    assert any(p.startswith("PROBLEM grid.models.qwen3-8b.resources.gpus_per_node: 8 GPUs") for p in problems)
    assert any(p.startswith("PROBLEM grid.eval: data_parallel_size x tensor_parallel_size = 8") for p in problems)
    assert P.check_nodes(PAPER, P.slurm_requests(ROOT / "slurm" / "config.yaml")) == []
    # the command prints it and fails
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    assert main(["plan", "--configfile", str(ROOT / "config" / "paper.yaml"), "--profile", str(path)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM train: set-resources.train.cpus_per_task = 200 CPUs per node" in out
    assert main(["plan", "--configfile", str(ROOT / "config" / "paper.yaml"), "--profile", str(tmp_path / "no")]) == 2
    assert "no such file, nor a folder holding config.yaml" in capsys.readouterr().err


def test_runtimes_cover_the_base_model_evaluations():
    """Rule evaluate_base (the base model as step 0) is priced in the evaluate row: a profile without an entry of
    its own gives it default-resources' runtime, which the plan checks too; the shipped profile's entry fits."""
    rows, _ = P.plan(PAPER)
    by = {r.rule: r for r in rows}
    long_enough = by["evaluate"].wall_h * 2 * 60
    (warning,) = P.check_runtimes(rows, {"evaluate": long_enough, "*": 1.0} | {r: 1e9 for r in by if r != "evaluate"})
    assert "(default-resources.runtime, rule evaluate_base)" in warning
    assert P.check_runtimes(rows, {"evaluate": long_enough, "evaluate_base": long_enough, "*": 1e9}) == []
    shipped = P.slurm_runtimes(ROOT / "slurm")
    assert shipped["evaluate_base"] == shipped["evaluate"] and P.check_runtimes(rows, shipped) == []
