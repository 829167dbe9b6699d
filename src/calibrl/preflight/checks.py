"""What the preflight checks on a compute node, each a function of the job's params that returns what it saw or
raises :class:`Failed` with the cause and the fix. Each runs the thing itself (a compile, an engine, a Ray
cluster, a lock), never a version lookup that could pass while the real call fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


class Failed(RuntimeError):
    """A check that failed: ``cause`` (what was seen) and ``fix`` (what to do)."""

    def __init__(self, cause: str, fix: str):
        super().__init__(cause)
        self.cause, self.fix = cause, fix


def device() -> str:
    """Where the GPU checks run their work: CUDA where torch sees it, else the CPU (a test cluster)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# ------------------------------------------------------------------------------------------- the node
def gpus(p: dict) -> str:
    """The GPUs the job asked for per node are visible to torch."""
    import torch

    want = int(p["gpus_per_node"])
    if torch.version.cuda is None:
        raise Failed(
            f"torch {torch.__version__} is a CPU build: no GPU is usable ({sys.prefix})",
            "run the jobs in the GPU venv (scripts/cluster_env.sh build; slurm/config.yaml's precommand, "
            "CALIBRL_GPU_VENV)",
        )
    seen = torch.cuda.device_count()
    if seen < want:
        raise Failed(
            f"the job asked for {want} GPUs per node and torch sees {seen} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
            "check that the partition has GPUs (sinfo -o '%P %N %G') and that set-resources.<rule>.slurm_partition "
            "in slurm/config.yaml names it; the request is the config's --gres",
        )
    return f"{seen} GPU(s): {torch.cuda.get_device_name(0)}"


def driver(p: dict) -> str:
    """The NVIDIA driver supports the CUDA version torch was built for."""
    import torch

    built = torch.version.cuda
    if built is None:
        raise Failed(f"torch {torch.__version__} has no CUDA", "run the jobs in the GPU venv (scripts/cluster_env.sh)")
    try:
        import pynvml

        pynvml.nvmlInit()
        code = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:
        raise Failed(
            f"no NVIDIA driver answers on this node ({type(exc).__name__}: {exc})",
            "run on a GPU node of the partition; the driver's libnvidia-ml.so must be on the library path",
        ) from exc
    supports = (code // 1000, code % 1000 // 10)
    needs = tuple(int(x) for x in built.split(".")[:2])
    if supports < needs:
        raise Failed(
            f"driver {version} supports CUDA {supports[0]}.{supports[1]}, torch {torch.__version__} needs {built}",
            f"a driver for CUDA {built} or newer (CUDA 13.0: R580+); ask the cluster's admins, or use a partition "
            f"whose nodes have it",
        )
    return f"driver {version} (CUDA {supports[0]}.{supports[1]}) for torch's CUDA {built}"


def compiler(p: dict) -> str:
    """Triton (vLLM's sampler and compiled graphs, flash-attn's cross-entropy) builds a small C module on first
    use: a C compiler and Python's headers must be there, and its cache writable."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if not cc:
        raise Failed(
            "no C compiler (CC, gcc, cc, clang): Triton compiles its launcher module with one on first use",
            "load a compiler in slurm/config.yaml's precommand (e.g. 'module load gcc') or set CC",
        )
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise Failed(
            f"no Python.h in {include}: Triton compiles against Python's headers",
            "build the GPU venv from a Python with its headers (python3.11-dev, or a uv/conda Python)",
        )
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("#include <Python.h>\nint calibrl_probe(void) { return PY_MAJOR_VERSION; }\n")
        out = subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", f"-I{include}", str(src), "-o", str(Path(tmp) / "probe.so")],
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise Failed(f"{cc} cannot build a Python extension: {out.stderr.strip()[-400:]}", "fix the compiler")
    cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(dir=cache).close()
    except OSError as exc:
        raise Failed(
            f"Triton's cache {cache} is not writable ({exc})", "set TRITON_CACHE_DIR to a writable folder"
        ) from exc
    return f"{cc} builds against {include}; Triton cache {cache}"


# ------------------------------------------------------------------------------------------ the stack
def flash_attn(p: dict) -> str:
    """OpenRLHF 0.11.2 imports flash-attn at module level (models/ring_attn_utils.py): its model code must import."""
    try:
        import flash_attn as fa
        import flash_attn.bert_padding  # noqa: F401
        import openrlhf.models  # noqa: F401
    except Exception as exc:
        raise Failed(
            f"OpenRLHF's model code does not import: {type(exc).__name__}: {exc}",
            "build the flash-attn wheel once on a GPU node (sbatch scripts/build_flash_attn.sh), then "
            "scripts/cluster_env.sh build",
        ) from exc
    return f"flash-attn {fa.__version__}, openrlhf.models imports"


def optimizer(p: dict) -> str:
    """DeepSpeed's FusedAdam, as OpenRLHF's actors build it, constructs and steps with no compiler."""
    from calibrl.backends.openrlhf import fused_adam

    try:
        return fused_adam.check(device())
    except Exception as exc:
        raise Failed(f"DeepSpeed's optimizer: {type(exc).__name__}: {exc}", "see the cause") from exc


def vllm_engine(p: dict) -> str:
    """A vLLM engine starts with the smallest of the grid's models and the jobs' settings and samples with top-p
    and top-k (the sampler path that would need a compiler with FlashInfer)."""
    from calibrl.evaluate.vllm import engine_kwargs, serve

    e = p["engine"]
    positions = json.loads((Path(e["model"]) / "config.json").read_text()).get("max_position_embeddings")
    length = min(int(e["max_model_len"]), int(positions or e["max_model_len"]))
    engine = engine_kwargs(e["model"], 0, 1, length, e["dtype"], e["enforce_eager"])
    engine["gpu_memory_utilization"] = 0.5
    got = []
    sampling = {"n": 2, "temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_tokens": 8, "seed": 1}
    try:
        serve(engine, ["1 + 1 ="], [sampling], got.extend)
    except Exception as exc:
        raise Failed(f"vLLM could not start or sample: {type(exc).__name__}: {str(exc)[:600]}", _vllm_fix()) from exc
    ((_, outs),) = got
    return f"{e['model']}: {len(outs)} samples of {[n for _, n in outs]} tokens"


def _vllm_fix() -> str:
    return (
        "the job's log above names the failing part; VLLM_USE_FLASHINFER_SAMPLER=0 is set (calibrl.offline), "
        "a compiler is checked by 'compiler'"
    )


def ray(p: dict) -> str:
    """A private Ray cluster with token auth spans the allocation's nodes, each with its GPUs
    (``ray_cluster.sh``, as the training jobs start it)."""
    script = Path(__file__).resolve().parents[1] / "backends" / "openrlhf" / "ray_cluster.sh"
    probe = [sys.executable, "-m", "calibrl.preflight.ray_probe", str(p["nodes"]), str(p["gpus_per_node"])]
    env = {**os.environ, "RAY_GPUS_PER_NODE": str(p["gpus_per_node"])}
    out = subprocess.run(["bash", str(script), *probe], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode:
        tail = (out.stderr + out.stdout).strip()[-1200:]
        raise Failed(f"the Ray cluster did not come up as the jobs need it:\n{tail}", "see ray_cluster.sh's message")
    return out.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------- data and disk
def models(p: dict) -> str:
    """Every model of the grid is on the shared disk, readable offline, at the commit of the lock file."""
    from calibrl.model_store import ModelNotLocked, verify

    seen = []
    for m in p["models"]:
        try:
            commit = verify(m["path"], m["hf_id"], m["revision"], m["lock"])
        except ModelNotLocked as exc:
            raise Failed(str(exc), "run the download_model jobs on the login node (they run first)") from exc
        if not (Path(m["path"]) / "config.json").is_file():
            raise Failed(f"{m['path']}: no config.json", "remove the folder and run download_model again")
        seen.append(f"{m['hf_id']}@{commit[:8]}")
    return ", ".join(dict.fromkeys(seen))  # two names may share a download


def disk(p: dict) -> str:
    """The results folder's file system has room for what the planner says the grid writes."""
    root = Path(p["results"])
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free / 1e9
    need = float(p["disk_gb"])
    if free < need:
        raise Failed(
            f"{root} has {free:.0f} GB free; calibrl plan estimates {need:.0f} GB for this grid",
            "free space, put 'results' on a larger file system, or keep fewer checkpoints (grid.retention)",
        )
    return f"{free:.0f} GB free for an estimated {need:.0f} GB"


def lock(p: dict) -> str:
    """The run lock (``calibrl.checkpoints.run_lock``) works on the results file system: taken by this process,
    refused to another one."""
    from calibrl.checkpoints import LOCK, LockUnsupported, run_lock

    folder = Path(p["results"]) / "preflight" / ".lock-probe"
    second = "import fcntl, os, sys; fcntl.flock(os.open(sys.argv[1], os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    try:
        with run_lock(folder):
            other = subprocess.run([sys.executable, "-c", second, str(folder / LOCK)], capture_output=True, text=True)
    except LockUnsupported as exc:
        cause, _, fix = str(exc).partition("; ")
        raise Failed(cause, fix) from exc
    if other.returncode == 0:
        raise Failed(
            f"{folder}: another process locked a file this one holds: the file system does not enforce flock",
            "put 'results' on a file system with working locks (Lustre: mount -o flock)",
        )
    if "BlockingIOError" not in other.stderr:
        raise Failed(f"{folder}: the second lock failed oddly: {other.stderr.strip()[-300:]}", "see the cause")
    return f"flock works on {Path(p['results']).resolve()}"
