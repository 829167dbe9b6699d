"""The environment of every compute job (``calibrl.offline``): offline, no telemetry, and the compile caches of vLLM,
Triton and torch on the node's own disk rather than the shared home folder, each only where the user has not set it,
with ``HF_HOME`` left where Hugging Face looked before."""

from __future__ import annotations

import os
from pathlib import Path

from calibrl import offline

HOME = Path("/home/alice")


def test_compile_caches_go_under_the_jobs_scratch_folder():
    """SLURM's per-job ``$TMPDIR`` where the site sets one (removed with the job); HF_HOME pinned where it was, since
    Hugging Face's default follows XDG_CACHE_HOME."""
    env = offline.cache_env({"TMPDIR": "/local/job42", "USER": "alice"}, HOME)
    base = "/local/job42/calibrl-cache"
    assert env == {
        "VLLM_CACHE_ROOT": f"{base}/vllm",
        "TRITON_CACHE_DIR": f"{base}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{base}/torchinductor",
        "XDG_CACHE_HOME": f"{base}/xdg",
        "HF_HOME": "/home/alice/.cache/huggingface",
    }


def test_without_a_scratch_folder_the_users_folder_in_tmp():
    env = offline.cache_env({"USER": "alice"}, HOME)
    assert env["VLLM_CACHE_ROOT"] == "/tmp/calibrl-cache-alice/vllm"
    assert env["TRITON_CACHE_DIR"] == "/tmp/calibrl-cache-alice/triton"


def test_what_the_user_set_is_kept():
    user = {
        "TMPDIR": "/scratch",
        "TRITON_CACHE_DIR": "/fast/triton",
        "VLLM_CACHE_ROOT": "",  # empty counts as unset
        "XDG_CACHE_HOME": "/fast/cache",
    }
    env = offline.cache_env(user, HOME)
    assert "TRITON_CACHE_DIR" not in env and "XDG_CACHE_HOME" not in env
    assert "HF_HOME" not in env  # XDG_CACHE_HOME is the user's: Hugging Face's default is unchanged
    assert env["VLLM_CACHE_ROOT"] == "/scratch/calibrl-cache/vllm"
    assert "HF_HOME" not in offline.cache_env({"HF_HOME": "/models/hf"}, HOME)


def test_apply_sets_the_caches_in_the_process_and_never_overrides(monkeypatch, tmp_path):
    for name in (*offline.ENV, *offline.CACHES, "HF_HOME"):  # unset, and restored after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine/triton")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    offline.apply()
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "calibrl-cache" / "vllm")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "calibrl-cache" / "torchinductor")
    assert os.environ["XDG_CACHE_HOME"] == str(tmp_path / "calibrl-cache" / "xdg")
    assert os.environ["HF_HOME"] == str(Path.home() / ".cache" / "huggingface")
    assert os.environ["TRITON_CACHE_DIR"] == "/mine/triton" and os.environ["HF_HUB_OFFLINE"] == "0"
    assert os.environ["VLLM_NO_USAGE_STATS"] == "1"
    before = dict(os.environ)
    offline.apply()  # a second call (the evaluator and the preflight call it too) changes nothing
    assert dict(os.environ) == before


def test_the_profile_fails_a_job_whose_venv_python_cannot_start(tmp_path):
    """A venv made from a `module load`ed Python (a shared libpython) starts only with its module's LD_LIBRARY_PATH:
    the profile's precommand, the first thing of every SLURM job (the preflight's too), fails such a job with the
    loader's error and what to do, instead of an error from deep inside Snakemake's start."""
    import subprocess
    import sys

    import yaml

    precommand = yaml.safe_load((Path(__file__).parents[1] / "slurm" / "config.yaml").read_text())["precommand"]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(  # what the loader prints for a module's Python without its library path
        "#!/bin/sh\necho 'python: error while loading shared libraries: libpython3.11.so.1.0: cannot open shared "
        "object file: No such file or directory' >&2\nexit 127\n"
    )
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CALIBRL_GPU_VENV": str(venv)}
    out = subprocess.run(["sh", "-c", f"{precommand} && echo started"], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "started" not in out.stdout
    assert "libpython3.11.so.1.0: cannot open shared object file" in out.stderr  # the loader's own words
    assert "LD_LIBRARY_PATH" in out.stderr and "load the module before snakemake" in out.stderr
    python.unlink()
    python.symlink_to(sys.executable)  # a python that starts
    out = subprocess.run(["sh", "-c", f"{precommand} && echo started"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "started", out.stderr
