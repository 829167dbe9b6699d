"""The cluster's GPU environment: it resolves against PyPI with this package, and the SLURM profile runs jobs in it.

The resolution runs ``scripts/cluster_env.sh check`` (what users run before ``build``) against PyPI with uv from
``.venv-cluster`` (``make .venv-cluster/.installed``; ``make test`` builds it) for CPython 3.11 on
manylinux_2_28 x86_64: it needs the network to PyPI and fails, saying so, without it. Nothing is installed.

flash-attn: the wheel names (``cluster_env.sh wheel-name``, as flash-attn's setup.py names its release wheels), the
pick from the wheel cache (``find-wheel`` and ``post``, on empty files named as wheels), and the checks
scripts/build_flash_attn.sh makes before it compiles, each on the condition it must detect. No compiling.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "cluster_env.sh"
BUILD = REPO / "scripts" / "build_flash_attn.sh"
REQUIREMENTS = REPO / "envs" / "cluster-gpu.txt"
PROFILE = REPO / "slurm" / "config.yaml"
CLUSTER_VENV = Path(os.environ.get("CALIBRL_CLUSTER_VENV", REPO / ".venv-cluster"))


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def run_check(tmp_path: Path, requirements: Path | None = None, trainer: str = "openrlhf"):
    uv = CLUSTER_VENV / "bin" / "uv"
    if not uv.exists():
        pytest.fail(f"no uv at {uv}: run `make .venv-cluster/.installed` (make test builds it)")
    env = {**os.environ, "UV": str(uv), "CHECK_OUT": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    if requirements is not None:
        env["CALIBRL_GPU_REQUIREMENTS"] = str(requirements)
    proc = subprocess.run(["bash", str(SCRIPT), "check", trainer], env=env, capture_output=True, text=True, timeout=300)
    if "cannot download" in proc.stderr or "Failed to fetch" in proc.stderr:
        pytest.fail(f"the resolution check needs the network to PyPI, which failed:\n{proc.stderr[-3000:]}")
    return proc, tmp_path / "cluster-gpu.lock.txt"


def pins(lock: Path) -> dict[str, str]:
    out = {}
    for line in lock.read_text().splitlines():
        if m := re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", line):
            out[m[1].lower().replace("_", "-")] = m[2]
        elif line.startswith("-e "):
            out["calibrl"] = line.split(None, 1)[1]
    return out


def test_pinned_gpu_stack_resolves_with_this_package(tmp_path):
    proc, lock = run_check(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OpenRLHF block matches the wheel's" in proc.stdout  # envs/cluster-gpu.txt == openrlhf 0.11.2 METADATA
    got = pins(lock)
    want = {"torch": "2.13.0", "vllm": "0.29.0", "ray": "2.55.0", "deepspeed": "0.19.6", "transformers": "5.15.0"}
    assert {k: got.get(k) for k in want} == want
    assert Path(got["calibrl"].removeprefix("file://")) == REPO  # this checkout, editable, in the same pass
    assert "nvidia-cuda-runtime" in got or "nvidia-cuda-runtime-cu12" in got  # PyPI's torch: the CUDA build
    assert "flash-attn" not in got and "snakemake-executor-plugin-slurm-jobstep" in got
    assert "snakemake-executor-plugin-slurm" not in got  # the submitting plugin stays on the login node


def test_verls_pinned_stack_resolves_with_this_package(tmp_path):
    """verl's own venv (scripts/cluster_env.sh check verl): verl 0.9.1 with its own requirements, which cap
    transformers below 5.11, beside the cluster's torch and vLLM (the evaluator's and DLC's composite model's)."""
    proc, lock = run_check(tmp_path, trainer="verl")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = pins(lock)
    want = {"torch": "2.13.0", "vllm": "0.29.0", "verl": "0.9.1", "transformers": "5.10.4", "ray": "2.55.0"}
    assert {k: got.get(k) for k in want} == want
    assert "openrlhf" not in got and "deepspeed" not in got  # OpenRLHF's stack stays in its venv
    assert Path(got["calibrl"].removeprefix("file://")) == REPO and "snakemake-executor-plugin-slurm-jobstep" in got


def test_check_refuses_a_set_that_cannot_resolve(tmp_path):
    """The login-node half of the SLURM plugin needs numpy>=2.4.5, vLLM 0.29.0 numpy<2.4: the check must fail."""
    bad = tmp_path / "bad.txt"
    bad.write_text(REQUIREMENTS.read_text() + "snakemake-executor-plugin-slurm==2.8.0\n")
    proc, _ = run_check(tmp_path, bad)
    assert proc.returncode != 0 and "does not resolve" in proc.stderr, proc.stderr[-3000:]
    dropped = tmp_path / "dropped.txt"
    dropped.write_text(REQUIREMENTS.read_text().replace("deepspeed==0.19.6\n", ""))
    proc, _ = run_check(tmp_path, dropped)
    assert proc.returncode != 0 and "missing ['deepspeed==0.19.6']" in proc.stderr, proc.stderr[-3000:]


# ------------------------------------------------------------------------------------------------ the Python
# RHEL 8/9 ship python3 3.6/3.9, Ubuntu 22.04 3.10: build and check find a CPython 3.11 or 3.12 before anything else.
def tools_without_python(tmp_path: Path, **pythons: str | Path) -> Path:
    """A PATH folder with the system's tools and no Python but ``pythons`` (name -> a version for a shell script that
    answers ``-V`` as that Python would and fails anything else, like a Python without pip; or a real interpreter)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in (Path("/usr/bin"), Path("/bin")):
        for tool in folder.iterdir():
            if not tool.name.startswith(("python", "pip", "pydoc", "uv")) and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    for name, python in pythons.items():
        if isinstance(python, Path):
            (bin_dir / name).symlink_to(python)
        else:
            (bin_dir / name).write_text(
                f'#!/bin/sh\ncase "$1" in -V|--version) echo "Python {python}";; '
                f'*) echo "{bin_dir / name}: No module named pip" >&2; exit 1;; esac\n'
            )
            (bin_dir / name).chmod(0o755)
    return bin_dir


def no_python_env(bin_dir: Path, tmp_path: Path, **extra: str) -> dict:
    drop = ("PYTHON", "CALIBRL_PYTHON", "UV", "VIRTUAL_ENV", "CALIBRL_GPU_VENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    empty_index = tmp_path / "index"  # a package index with nothing in it: pip fails at once, no network
    empty_index.mkdir(exist_ok=True)
    return {**env, "PATH": str(bin_dir), "HOME": str(tmp_path), "INDEX_URL": empty_index.as_uri(), **extra}


REAL_PYTHON = Path(getattr(sys, "_base_executable", sys.executable))  # this CPython, outside the test venv
REAL_NAME = f"python{sys.version_info.major}.{sys.version_info.minor}"
INSTALL_HINTS = ("module load python/3.11", "uv python install 3.11", "dnf install python3.11", "apt install python3")


@pytest.mark.parametrize("command", ["check", "build"])
def test_an_old_python3_alone_is_named_with_what_to_install(tmp_path, command):
    """Only a python3 3.9 (RHEL 9's): exit 3 before anything runs, saying what it saw and how to get 3.11, not that
    the network failed; build makes no venv."""
    bin_dir = tools_without_python(tmp_path, python3="3.9.18")
    venv = tmp_path / "venv"
    proc = run_script(SCRIPT, command, env=no_python_env(bin_dir, tmp_path, CALIBRL_GPU_VENV=str(venv)))
    assert proc.returncode == 3, proc.stderr
    assert "no CPython 3.11 or 3.12" in proc.stderr and f"{bin_dir / 'python3'}: 3.9, below 3.10" in proc.stderr
    assert all(hint in proc.stderr for hint in INSTALL_HINTS), proc.stderr
    assert not any(s in proc.stderr for s in ("cannot download", "network", "No module named")), proc.stderr
    assert not venv.exists()


def test_python_310_and_313_are_refused_naming_the_pins_that_need_another(tmp_path):
    """3.10 (Ubuntu 22.04's python3): the GPU stack has cp310 wheels, snakemake 9.27.1 and the job-step plugin do
    not (on PyPI: pip download --python-version 3.10 --only-binary=:all: finds torch 2.13.0, vllm 0.29.0, openrlhf
    0.11.2, transformers 5.15.0, no snakemake 9.27.1); 3.13: OpenRLHF 0.11.2 has wheels for cp310-cp312 only."""
    bin_dir = tools_without_python(tmp_path, **{"python3.10": "3.10.12", "python3": "3.13.1"})
    proc = run_script(SCRIPT, "check", env=no_python_env(bin_dir, tmp_path))
    assert proc.returncode == 3, proc.stderr
    need_311 = "3.10: snakemake 9.27.1 and snakemake-executor-plugin-slurm-jobstep (every SLURM job runs in the venv)"
    assert f"{bin_dir / 'python3.10'}: {need_311}" in proc.stderr
    assert f"{bin_dir / 'python3'}: 3.13.1" not in proc.stderr  # X.Y, as the interpreter reported it
    assert f"{bin_dir / 'python3'}: 3.13: OpenRLHF 0.11.2 publishes wheels for CPython 3.10-3.12 only" in proc.stderr


@pytest.mark.skipif(sys.version_info[:2] not in ((3, 11), (3, 12)), reason="needs this CPython to be 3.11 or 3.12")
def test_a_python_311_passes_and_every_step_of_the_check_runs_in_it(tmp_path):
    """python3 is 3.9 (and has no pip), python3.11 a real interpreter: it is chosen, and the check's first network
    step runs in it (fails on the empty index, naming it); build stops there too, before making its venv."""
    bin_dir = tools_without_python(tmp_path, python3="3.9.18", **{REAL_NAME: REAL_PYTHON})
    env = no_python_env(bin_dir, tmp_path, CALIBRL_GPU_VENV=str(tmp_path / "venv"))
    which = run_script(SCRIPT, "python", env=env)
    assert which.returncode == 0 and which.stdout.split() == [str(bin_dir / REAL_NAME), REAL_NAME[6:]], which.stderr
    for command in ("check", "build"):
        proc = run_script(SCRIPT, command, env=env)
        assert proc.returncode == 1, proc.stderr
        assert f"Python {REAL_NAME[6:]} at {bin_dir / REAL_NAME}" in proc.stderr
        assert f"cannot download openrlhf==0.11.2 from {env['INDEX_URL']}" in proc.stderr
        assert f"(Python {REAL_NAME[6:]}; the check needs the network" in proc.stderr
        assert "No module named" not in proc.stderr  # python3 (3.9, no pip) was never run
        assert not (tmp_path / "venv").exists()


def test_an_explicit_python_is_the_only_one_tried(tmp_path):
    bin_dir = tools_without_python(tmp_path, old="3.9.18", **{REAL_NAME: REAL_PYTHON})
    refused = run_script(SCRIPT, "check", env=no_python_env(bin_dir, tmp_path, PYTHON="old"))
    assert refused.returncode == 3 and "no CPython 3.11 or 3.12 in PYTHON" in refused.stderr, refused.stderr
    seen = refused.stderr.split("Seen:\n")[1].split("Get a CPython")[0].splitlines()
    assert seen == [f"    {bin_dir / 'old'}: 3.9, below 3.10, which every package of the stack needs"], seen
    missing = run_script(SCRIPT, "check", env=no_python_env(bin_dir, tmp_path, PYTHON="/nowhere/python3.11"))
    assert missing.returncode == 3 and "PYTHON=/nowhere/python3.11: not found" in missing.stderr, missing.stderr
    chosen = run_script(SCRIPT, "python", env=no_python_env(bin_dir, tmp_path, PYTHON="old", CALIBRL_PYTHON=REAL_NAME))
    assert chosen.returncode == 0 and chosen.stdout.split()[0] == str(bin_dir / REAL_NAME), chosen.stderr
    assert "(CALIBRL_PYTHON)" in chosen.stderr


@pytest.mark.skipif(sys.version_info[:2] not in ((3, 11), (3, 12)), reason="needs this CPython to be 3.11 or 3.12")
def test_the_venv_and_requirements_are_the_trainers(tmp_path):
    """build, check and env take a trainer (openrlhf where none is given): its GPU side's venv and requirements,
    read from its folder by a Python without the package's requirements; CALIBRL_GPU_VENV and
    CALIBRL_GPU_REQUIREMENTS replace them; a trainer without a GPU side, or none of that name, is refused."""
    from calibrl import backends

    bin_dir = tools_without_python(tmp_path, **{REAL_NAME: REAL_PYTHON})
    env = no_python_env(bin_dir, tmp_path)
    env.pop("CALIBRL_GPU_REQUIREMENTS", None)

    def paths(*args: str, **extra: str) -> dict[str, str]:
        proc = run_script(SCRIPT, "env", *args, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr
        return dict(line.split("=", 1) for line in proc.stdout.splitlines())

    for name in backends.names():
        gpu = backends.get(name).gpu
        if gpu is None:
            refused = run_script(SCRIPT, "env", name, env=env)
            assert refused.returncode == 1 and f"trainer {name} has no GPU side" in refused.stderr, refused.stderr
            continue
        want = {"venv": str(REPO / gpu.venv), "requirements": str(REPO / gpu.requirements)}
        assert paths(name) == want, name
    assert paths() == paths("openrlhf") == {"venv": str(REPO / ".venv-gpu"), "requirements": str(REQUIREMENTS)}
    assert paths(CALIBRL_GPU_VENV="/site/venv")["venv"] == "/site/venv"
    assert paths(CALIBRL_GPU_REQUIREMENTS="/site/reqs.txt")["requirements"] == "/site/reqs.txt"
    unknown = run_script(SCRIPT, "build", "nonesuch", env={**env, "CALIBRL_GPU_VENV": str(tmp_path / "venv")})
    assert unknown.returncode == 1 and "unknown trainer 'nonesuch'" in unknown.stderr, unknown.stderr
    assert not (tmp_path / "venv").exists()


def test_build_refuses_a_venv_made_with_an_old_python(tmp_path):
    """A .venv-gpu left by an earlier build with python3 3.9: build says to remove it, before the network."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    old = tools_without_python(tmp_path, python="3.9.18") / "python"
    (venv / "bin" / "python").symlink_to(old)
    bin_dir = tmp_path / "bin"
    (bin_dir / REAL_NAME).symlink_to(REAL_PYTHON)
    proc = run_script(SCRIPT, "build", env=no_python_env(bin_dir, tmp_path, CALIBRL_GPU_VENV=str(venv)))
    assert proc.returncode == 1 and f"{venv} is Python 3.9 (3.9, below 3.10" in proc.stderr, proc.stderr
    assert f"rm -rf {venv}" in proc.stderr and "cannot download" not in proc.stderr


def test_conda_envs_repeat_the_venv_and_install_the_package_from_the_checkout():
    """`--sdm conda`: the same pip list, and no relative path (it would resolve against .snakemake/conda/)."""
    venv_reqs = requirement_lines(REQUIREMENTS)
    for name in ("cluster-train", "cluster-eval", "local"):
        env = yaml.safe_load((REPO / "envs" / f"{name}.yaml").read_text())
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        assert not any(r.startswith(("-e", ".", "/")) or ".." in r for r in pip), (name, pip)
        if name != "local":
            assert pip == venv_reqs, name
        deploy = (REPO / "envs" / f"{name}.post-deploy.sh").read_text()
        assert ("scripts/cluster_env.sh post" in deploy) or ("pip install -e ." in deploy)


def test_profile_runs_slurm_jobs_in_the_gpu_venv(tmp_path):
    """Snakemake's own parser reads the profile; its precommand, run by sh, puts the venv's python first."""
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.settings import SharedFSUsage

    cwd = os.getcwd()
    os.chdir(REPO)  # `--profile slurm` is looked up in the working directory
    try:
        _, args = parse_args(["--profile", "slurm", "-n"])
    finally:
        os.chdir(cwd)
    usage = set(args.shared_fs_usage)
    # without it the remote executor runs jobs as `python -m snakemake` (PATH), not the login node's interpreter
    assert SharedFSUsage.SOFTWARE_DEPLOYMENT not in usage and SharedFSUsage.SOURCES in usage

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    which = f"{args.precommand} && command -v python"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    ok = subprocess.run(["sh", "-c", which], env={**env, "CALIBRL_GPU_VENV": str(venv)}, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip() == str(venv / "bin" / "python"), ok.stderr
    (tmp_path / "work" / ".venv-gpu" / "bin").mkdir(parents=True)  # the default: <workdir>/.venv-gpu
    os.symlink(sys.executable, tmp_path / "work" / ".venv-gpu" / "bin" / "python")
    ok = subprocess.run(["sh", "-c", which], cwd=tmp_path / "work", env=env, capture_output=True, text=True)
    assert ok.stdout.strip().endswith("/work/.venv-gpu/bin/python"), ok.stderr
    missing = subprocess.run(["sh", "-c", which], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "scripts/cluster_env.sh build" in missing.stderr


def test_profile_leaves_gpu_requests_to_the_config():
    """train, evaluate and rank_train request their nodes and GPUs from the config (calibrl.backends.openrlhf.layout,
    grid.eval): a `nodes`, `gres` or `gpu` in the profile's set-resources would replace that request."""
    resources = yaml.safe_load(PROFILE.read_text())["set-resources"]
    for rule in ("train", "evaluate", "rank_train"):
        assert not {"nodes", "gres", "gpu"} & set(resources[rule]), rule
    assert resources["train_metrics"]["slurm_partition"] == "cpu"


# ------------------------------------------------------------------------------------------------ flash-attn
def run_script(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def python_env(python_dir: Path, **extra: str) -> dict:
    """The scripts' `python` is the first on PATH: this interpreter's, or a test venv's."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FLASH_ATTN_WHEEL")}
    return {**env, "PATH": f"{python_dir}{os.pathsep}{env['PATH']}", **extra}


def cuda_home() -> Path | None:
    """A CUDA toolkit on this machine (bin/nvcc and include/cuda_runtime.h), for the checks that need a real nvcc."""
    nvcc = shutil.which("nvcc")
    homes = [Path(nvcc).parent.parent, Path(nvcc).resolve().parent.parent] if nvcc else []
    for home in [*homes, Path("/usr/local/cuda")]:
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return home
    return None


def nvcc_version(home: Path) -> str:
    out = subprocess.run([home / "bin" / "nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"release (\d+\.\d+)", out)[1]


def torch_venv(path: Path, version: str, cuda: str) -> Path:
    """A venv (no pip) whose `torch` reports this version and CUDA: it stands in for the cluster's torch in the
    scripts' checks, which read torch.__version__, torch.version.cuda and torch._C._GLIBCXX_USE_CXX11_ABI only."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    site = next(path.glob("lib/python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        f"__version__ = {version!r}\n\n\nclass version:\n    cuda = {cuda!r}\n\n\n"
        "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n"
    )
    return path


def wheel_name(*torch_facts: str) -> dict[str, str]:
    proc = run_script(SCRIPT, "wheel-name", *torch_facts, env=python_env(Path(sys.executable).parent))
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


RELEASES = "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/"


@pytest.mark.parametrize(
    ("torch_facts", "release", "published", "label"),
    [
        # PyPI's torch 2.13.0 (CUDA 13.0): setup.py guesses cu12 for every CUDA >= 12, and no such wheel exists
        ("2.13.0 13.0 TRUE cp311", "cu12torch2.13cxx11abiTRUE-cp311-cp311", False, "cu13torch2.13cxx11abiTRUE"),
        ("2.13.0+cu130 13.0 True cp311", "cu12torch2.13cxx11abiTRUE-cp311-cp311", False, "cu13torch2.13cxx11abiTRUE"),
        ("2.8.0+cu128 12.8 TRUE cp311", "cu12torch2.8cxx11abiTRUE-cp311-cp311", True, "cu12torch2.8cxx11abiTRUE"),
        ("2.6.0 12.4 FALSE cp310", "cu12torch2.6cxx11abiFALSE-cp310-cp310", True, "cu12torch2.6cxx11abiFALSE"),
        ("2.4.1 11.8 false cp310", "cu11torch2.4cxx11abiFALSE-cp310-cp310", False, "cu11torch2.4cxx11abiFALSE"),
        ("2.4.0 12.4 TRUE cp313", "cu12torch2.4cxx11abiTRUE-cp313-cp313", False, "cu12torch2.4cxx11abiTRUE"),
        ("2.10.0 12.8 TRUE cp311", "cu12torch2.10cxx11abiTRUE-cp311-cp311", False, "cu12torch2.10cxx11abiTRUE"),
    ],
)
def test_flash_attn_wheel_names_follow_its_setup_py(torch_facts, release, published, label):
    """As get_wheel_url in flash-attn 2.8.3's setup.py names them; published: its release wheels (torch 2.4-2.8,
    CUDA 12.9 only, CPython 3.9-3.13, torch 2.4 to 3.12). The label is CUDA's real major: a build for cu130 is cu13."""
    names = wheel_name(*torch_facts.split(), "linux_x86_64")
    assert names["release_wheel"] == f"flash_attn-2.8.3+{release}-linux_x86_64.whl"
    assert names["release_url"] == (RELEASES + names["release_wheel"] if published else "")
    assert names["build_label"] == label
    assert (names["why"] == "") == published and (published or "publishes no wheel" in names["why"])


def test_a_cpu_torch_has_no_flash_attn_wheel():
    import torch

    if torch.version.cuda:
        pytest.skip("this interpreter's torch is a CUDA build")
    proc = run_script(SCRIPT, "wheel-name", env=python_env(Path(sys.executable).parent))
    assert proc.returncode == 1 and "has no CUDA" in proc.stderr, proc.stderr


def test_the_cache_gives_only_the_wheel_built_for_this_torch(tmp_path):
    cache = tmp_path / "wheels"
    cache.mkdir()
    others = [
        "flash_attn-2.8.3+cu13torch2.12cxx11abitrue-cp311-cp311-linux_x86_64.whl",  # another torch
        "flash_attn-2.8.3+cu13torch2.1cxx11abitrue-cp311-cp311-linux_x86_64.whl",  # torch 2.1 (2.13 begins so)
        "flash_attn-2.8.3+cu12torch2.13cxx11abiTRUE-cp311-cp311-linux_x86_64.whl",  # CUDA 12
        "flash_attn-2.8.3+cu13torch2.13cxx11abifalse-cp311-cp311-linux_x86_64.whl",  # the other C++ ABI
        "flash_attn-2.8.3+cu13torch2.13cxx11abitrue-cp312-cp312-linux_x86_64.whl",  # another Python
        "flash_attn-2.8.3+cu13torch2.13cxx11abitrue-cp311-cp311-linux_aarch64.whl",  # another platform
        "flash_attn-2.8.2+cu13torch2.13cxx11abitrue-cp311-cp311-linux_x86_64.whl",  # another flash-attn
        "flash_attn-2.8.3.post1+cu13torch2.13cxx11abitrue-cp311-cp311-linux_x86_64.whl",
        "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl",  # no local version: built for which torch?
        "flash_attn-2.8.3.tar.gz",
    ]
    for name in others:
        (cache / name).touch()
    env = python_env(Path(sys.executable).parent, CALIBRL_WHEELS=str(cache))
    torch_213 = ("2.13.0", "13.0", "TRUE", "cp311", "linux_x86_64")
    miss = run_script(SCRIPT, "find-wheel", *torch_213, env=env)
    assert miss.returncode == 1 and miss.stdout == "", miss.stdout
    assert all(f"not {name} " in miss.stderr for name in others if name.endswith(".whl")), miss.stderr
    built = cache / "flash_attn-2.8.3+cu13torch2.13cxx11abitrue-cp311-cp311-linux_x86_64.whl"  # as pip names it
    built.touch()
    hit = run_script(SCRIPT, "find-wheel", *torch_213, env=env)
    assert hit.returncode == 0 and hit.stdout.strip() == str(built), hit.stderr
    release = cache / "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"  # downloaded
    release.touch()
    hit = run_script(SCRIPT, "find-wheel", "2.8.0+cu128", "12.8", "TRUE", "cp311", "linux_x86_64", env=env)
    assert hit.returncode == 0 and hit.stdout.strip() == str(release), hit.stderr


def test_post_takes_the_wheel_then_the_cache_then_a_release_else_names_the_build(tmp_path):
    """`post` in a venv whose torch reports 2.13.0/CUDA 13.0 (no pip: each install stops at once, after `post`
    said which wheel it installs)."""
    venv = torch_venv(tmp_path / "venv", "2.13.0+cu130", "13.0")
    cache = tmp_path / "wheels"
    env = python_env(venv / "bin", CALIBRL_WHEELS=str(cache), INDEX_URL="http://127.0.0.1:9/simple")
    none = run_script(SCRIPT, "post", env=env)
    assert none.returncode == 1 and "flash-attn from" not in none.stderr, none.stderr
    assert "publishes no wheel for torch 2.13" in none.stderr and "cu13torch2.13cxx11abiTRUE" in none.stderr
    assert "sbatch scripts/build_flash_attn.sh" in none.stderr and str(cache) in none.stderr
    built = cache / "flash_attn-2.8.3+cu13torch2.13cxx11abitrue-cp311-cp311-linux_x86_64.whl"
    built.touch()
    cached = run_script(SCRIPT, "post", env=env)
    assert f"flash-attn from {built}\n" in cached.stderr and cached.returncode == 1, cached.stderr
    given = run_script(SCRIPT, "post", env={**env, "FLASH_ATTN_WHEEL": "/site/flash_attn.whl"})
    assert "flash-attn from /site/flash_attn.whl\n" in given.stderr, given.stderr
    old = torch_venv(tmp_path / "venv-2.8", "2.8.0+cu128", "12.8")
    released = run_script(SCRIPT, "post", env={**env, "PATH": f"{old / 'bin'}{os.pathsep}{env['PATH']}"})
    url = f"{RELEASES}flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
    assert f"flash-attn from {url}\n" in released.stderr, released.stderr


# build_flash_attn.sh, run here (outside SLURM): each check stops it before anything is compiled
def build(venv: Path, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    env = python_env(venv / "bin", CALIBRL_GPU_VENV=str(venv), CALIBRL_WHEELS=str(tmp_path / "wheels"), **extra)
    proc = run_script(BUILD, env=env)
    assert proc.returncode == 1, proc.stderr
    assert not list(tmp_path.glob("wheels/.build-*")), "compiling began"
    return proc


def test_build_stops_on_a_cpu_torch(tmp_path):
    import torch

    if torch.version.cuda:
        pytest.skip("this interpreter's torch is a CUDA build")
    proc = build(Path(sys.prefix), tmp_path)
    assert "error: torch has no CUDA" in proc.stderr and "a CPU build" in proc.stderr, proc.stderr


def test_build_stops_without_nvcc(tmp_path):
    venv = torch_venv(tmp_path / "venv", "2.13.0+cu130", "13.0")
    runtime_only = tmp_path / "cuda-runtime"  # a CUDA_HOME without the compiler
    (runtime_only / "lib64").mkdir(parents=True)
    proc = build(venv, tmp_path, CUDA_HOME=str(runtime_only))
    assert f"error: no nvcc: CUDA_HOME={runtime_only} has no bin/nvcc" in proc.stderr, proc.stderr
    assert "load the CUDA 13 toolkit" in proc.stderr and "module load cuda/13.0" in proc.stderr
    if shutil.which("nvcc", path="/usr/bin:/bin") or Path("/usr/local/cuda/bin/nvcc").exists():
        return  # torch's last resort, /usr/local/cuda, would find one here
    proc = build(venv, tmp_path, PATH="/usr/bin:/bin")
    assert "error: no nvcc: no CUDA_HOME, no nvcc on PATH" in proc.stderr, proc.stderr


def test_build_stops_on_an_nvcc_of_another_cuda_major(tmp_path):
    home = cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit here")
    major = int(nvcc_version(home).split(".")[0])
    venv = torch_venv(tmp_path / "venv", "2.13.0", f"{major - 1}.8")
    proc = build(venv, tmp_path, CUDA_HOME=str(home))
    assert f"is not CUDA {major - 1}: torch refuses to compile" in proc.stderr, proc.stderr


def test_build_stops_without_its_build_requirements_then_takes_a_cached_wheel(tmp_path):
    home = cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit here")
    version = nvcc_version(home)
    venv = torch_venv(tmp_path / "venv", "2.13.0", version)  # the toolkit matches; no pip, no psutil
    proc = build(venv, tmp_path, CUDA_HOME=str(home))
    assert f"nvcc {version} at {home}" in proc.stderr, proc.stderr
    assert re.search(r"error: the build requirements .*psutil.* are missing in .* cannot be installed", proc.stderr)
    cache = tmp_path / "wheels"
    cache.mkdir()
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    cached = cache / f"flash_attn-2.8.3+cu{version.split('.')[0]}torch2.13cxx11abitrue-{py}-{py}-linux_x86_64.whl"
    cached.touch()
    proc = build(venv, tmp_path)  # no toolkit needed for what is built already
    assert f"the cache has {cached} for this torch: installing it, nothing to build" in proc.stderr, proc.stderr
    assert "pip cannot install" in proc.stderr and "nvcc" not in proc.stderr


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("local_slurm")
def test_build_job_stops_under_sbatch_with_its_cause(tmp_path):
    """`sbatch scripts/build_flash_attn.sh` from the checkout's root, with its #SBATCH partition gpu and gres gpu:1
    (stand-in GPUs here) and only CPUs, memory and time scaled down: the job runs a copy from SLURM's spool folder,
    finds the checkout by the submit folder, and stops on a CPU torch."""
    import torch

    if torch.version.cuda:
        pytest.skip("this interpreter's torch is a CUDA build")
    log = tmp_path / "build-%j.out"
    cmd = ["sbatch", "--wait", "--cpus-per-task=1", "--mem=500M", "--time=5", f"--output={log}", str(BUILD)]
    env = {**os.environ, "CALIBRL_GPU_VENV": sys.prefix, "CALIBRL_WHEELS": str(tmp_path / "wheels")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    job = re.search(r"Submitted batch job (\d+)", proc.stdout)[1]
    out = (tmp_path / f"build-{job}.out").read_text()
    assert proc.returncode == 1, proc.stdout + proc.stderr + out
    assert f"SLURM job {job}: flash-attn 2.8.3 for {sys.prefix}" in out and "error: torch has no CUDA" in out, out
