"""What the preflight checks on a compute node, each a function of the job's params that returns what it saw or
raises :class:`Failed` with the cause and the fix. Each runs the thing itself (a compile, an engine, a Ray
cluster, a lock), never a version lookup that could pass while the real call fails."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from calibrl import plugins
from calibrl.backends import CheckFailed
from calibrl.gpu import RAY_CLUSTER

log = logging.getLogger("calibrl.preflight")


Failed = CheckFailed  # a check's failure, with its cause and fix (the protocol's: a backend's checks raise it too)


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


# ------------------------------------------------------------------------------------------ engines
def vllm_engine(p: dict) -> str:
    """Every engine of ``p["engines"]`` (``calibrl.preflight.engines``) starts and samples: the evaluator's as the
    evaluation jobs start it (top-p and top-k: the sampler path that would need a compiler with FlashInfer), and
    each training kind as its backend starts its rollout engines (``engine_probe``: the worker extension, sleep mode
    with a sleep / wake-up cycle, the run's tensor-parallel size, DLC's composite model)."""
    try:
        plugins.check()  # an install older than the entry points fails every engine process
    except plugins.StalePlugins as exc:
        raise Failed(exc.cause, plugins.FIX) from exc
    seen = []
    for e in p["engines"]:
        if e["role"] == "evaluation":
            seen.append(f"evaluation engine: {_evaluator_engine(e)}")
        else:
            seen.append(f"training engine of {', '.join(e['runs_of'])}: {_training_engine(e, p)}")
    return " | ".join(seen)


def _evaluator_engine(e: dict) -> str:
    from calibrl.evaluate.vllm import engine_kwargs, serve

    positions = json.loads((Path(e["model"]) / "config.json").read_text()).get("max_position_embeddings")
    length = min(int(e["max_model_len"]), int(positions or e["max_model_len"]))
    tp = int(e["tensor_parallel_size"])
    engine = engine_kwargs(e["model"], 0, tp, length, e["dtype"], e["enforce_eager"])
    engine["gpu_memory_utilization"] = 0.5
    got = []
    sampling = {"n": 2, "temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_tokens": 8, "seed": 1}
    try:
        serve(engine, ["1 + 1 ="], [sampling], got.extend)
    except Exception as exc:
        raise Failed(f"vLLM could not start or sample: {type(exc).__name__}: {str(exc)[:600]}", _vllm_fix()) from exc
    ((_, outs),) = got
    return f"{e['model']}, TP {tp}: {len(outs)} samples of {[n for _, n in outs]} tokens"


def _training_engine(e: dict, p: dict) -> str:
    """``engine_probe`` in a process of its own; inside ``ray_cluster.sh`` where TP > 1 (OpenRLHF's engines then
    run vLLM's Ray executor, which joins the cluster in ``RAY_ADDRESS``)."""
    from calibrl.preflight.engine_probe import MARK

    spec = {k: v for k, v in e.items() if k not in ("role", "runs_of", "env")}
    argv = [sys.executable, "-m", "calibrl.preflight.engine_probe", json.dumps(spec)]
    env = {**os.environ, **(e.get("env") or {})}  # what the backend's launcher gives its engines' processes
    if int(e["tensor_parallel_size"]) > 1:
        argv = ["bash", str(RAY_CLUSTER), *argv]
        env["RAY_GPUS_PER_NODE"] = str(p["gpus_per_node"])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1500)
    except subprocess.TimeoutExpired as exc:
        raise Failed(f"the training engine did not start and sample within {exc.timeout:.0f} s", _vllm_fix()) from exc
    said = [json.loads(line[len(MARK) :]) for line in out.stdout.splitlines() if line.startswith(MARK)]
    if said and "detail" in said[-1] and out.returncode == 0:
        return said[-1]["detail"]
    log.warning("the training engine's output:\n%s", (out.stdout + out.stderr)[-8000:])
    if said and "cause" in said[-1]:
        raise Failed(said[-1]["cause"], said[-1]["fix"])
    tail = _error_tail(out.stdout + "\n" + out.stderr)
    raise Failed(f"vLLM could not start the training engine the way its trainer does:\n{tail}", _vllm_fix())


def _vllm_fix() -> str:
    return (
        "the job's log above names the failing part; VLLM_USE_FLASHINFER_SAMPLER=0 is set (calibrl.offline), "
        "a compiler is checked by 'compiler'"
    )


def _error_tail(text: str, size: int = 1200) -> str:
    """The end of a failed process's output, from its last traceback's last lines where there is one."""
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if re.match(r"^(\(\w+ pid=\d+\) )?\w*(Error|Exception)\b", line)]
    picked = lines[max(0, errors[-1] - 3) :] if errors else lines
    return "\n".join(picked)[-size:]


def ray(p: dict) -> str:
    """A private Ray cluster with token auth spans the allocation's nodes, each with its GPUs (``ray_cluster.sh``,
    as the training jobs start it), and GPU actors placed as OpenRLHF places its roles all-reduce between them
    (``ray_probe``: NCCL across the nodes of a multi-node shape, across two GPUs of a single node; gloo without
    CUDA)."""
    probe = [sys.executable, "-m", "calibrl.preflight.ray_probe", str(p["nodes"]), str(p["gpus_per_node"])]
    env = {**os.environ, "RAY_GPUS_PER_NODE": str(p["gpus_per_node"])}
    try:
        out = subprocess.run(["bash", str(RAY_CLUSTER), *probe], capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise Failed(f"the Ray cluster or its GPU actors did not finish within {exc.timeout:.0f} s", _RAY_FIX) from exc
    if out.returncode:
        tail = (out.stderr + out.stdout).strip()[-1500:]
        raise Failed(f"the Ray cluster did not come up or run collectives as the jobs need:\n{tail}", _RAY_FIX)
    return out.stdout.strip().splitlines()[-1]


_RAY_FIX = (
    "see ray_cluster.sh's message; for a collective that fails or hangs, NCCL_DEBUG=INFO in the job's environment "
    "(slurm/config.yaml's precommand) shows the interfaces NCCL chose, NCCL_SOCKET_IFNAME / NCCL_IB_HCA set them"
)


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
    """The results folder has room for what the planner says the grid writes: the file system's free space, or
    less where a quota leaves less (:func:`quotas`: ``lfs quota`` on Lustre, ``quota`` elsewhere)."""
    root = Path(p["results"])
    root.mkdir(parents=True, exist_ok=True)
    fs_free = shutil.disk_usage(root).free / 1e9
    need = float(p["disk_gb"])
    found, notes = quotas(root)
    free, why = fs_free, f"the file system has {fs_free:.0f} GB free"
    for q in found:
        if q["over_files"]:
            raise Failed(
                f"{q['who']} is at its file-count limit on {root} ({q['files']} files; {q['command']}): no new file "
                f"can be written",
                "remove files or ask the cluster's admins for a larger inode quota",
            )
        if q["left_gb"] is not None and q["left_gb"] < free:
            free, why = q["left_gb"], f"{q['who']}'s quota leaves {q['left_gb']:.0f} GB ({q['command']})"
    said = [f"file system {fs_free:.0f} GB free"] + [_said(q) for q in found] + notes
    if free < need:
        quota = free < fs_free
        raise Failed(
            f"{root}: {why}; calibrl plan estimates {need:.0f} GB for this grid ({'; '.join(said)})",
            ("ask for a larger quota, or " if quota else "free space, or ")
            + "put 'results' on a larger file system, or keep fewer checkpoints (grid.retention)",
        )
    return f"{free:.0f} GB free for an estimated {need:.0f} GB ({'; '.join(said)})"


def _said(q: dict) -> str:
    if q["left_gb"] is None:
        return f"{q['who']}: no limit ({q['command']})"
    return f"{q['who']}: {q['left_gb']:.0f} GB left of {q['limit_gb']:.0f} GB ({q['command']})"


def filesystem(path: Path) -> dict:
    """``{"type", "source", "mount"}`` of the file system holding ``path``, from ``df -PT`` (``stat -f`` for the type
    where df fails)."""
    out = _run(["df", "-PT", str(path)])
    rows = out.splitlines()[1:] if out else []
    if rows:
        fields = rows[-1].split()
        if len(fields) >= 7:
            return {"type": fields[1].lower(), "source": fields[0], "mount": " ".join(fields[6:])}
    kind = _run(["stat", "-f", "-c", "%T", str(path)]).strip().lower()
    mount = Path(path).resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return {"type": kind or "unknown", "source": "", "mount": str(mount)}


def quotas(root: Path) -> tuple[list[dict], list[str]]:
    """The quotas that bound what this user can write under ``root``, and notes on what could not be read.

    Lustre (``df -T``/``stat -f`` say ``lustre``, ``lfs`` on PATH): ``lfs quota -u USER``, ``-g`` for the group new
    files get (the folder's where it is setgid, else the user's), and ``-p`` for the folder's project where it has
    one (``lfs project -d``). Elsewhere ``quota -w -u USER`` where the tool is installed, its row of this file
    system. Each quota as ``{"who", "command", "left_gb", "limit_gb", "over_files", "files"}``: what is left below
    the lower of the soft and hard limits (writing past the soft one works only until its grace period ends;
    ``left_gb`` None where neither is set)."""
    fs = filesystem(root)
    user = os.environ.get("USER") or _user()
    found, notes = [], []
    if fs["type"] == "lustre":
        if not shutil.which("lfs"):
            return [], ["Lustre, but no lfs on PATH: quotas not read"]
        st = root.stat()
        gid = st.st_gid if st.st_mode & 0o2000 else os.getegid()
        asks = [("-u", user, f"user {user}"), ("-g", str(gid), f"group {_group(gid)}")]
        project = _run(["lfs", "project", "-d", str(root)]).split()
        if project and project[0].isdigit() and int(project[0]):
            asks.append(("-p", project[0], f"project {project[0]}"))
        for flag, who, name in asks:
            command = ["lfs", "quota", flag, who, fs["mount"]]
            rows = parse_quota(_run(command))
            if not rows:
                notes.append(f"{' '.join(command)} printed no quota")
                continue
            found.append(_quota(rows[0], name, " ".join(command)))
    elif shutil.which("quota"):
        command = ["quota", "-w", "-u", user]
        rows = [r for r in parse_quota(_run(command)) if r["filesystem"] in (fs["source"], fs["mount"])]
        if rows:
            found.append(_quota(rows[0], f"user {user}", " ".join(command)))
    return found, notes


def _quota(row: dict, who: str, command: str) -> dict:
    limits = [x for x in (row["quota"], row["limit"]) if x > 0]
    flimits = [x for x in (row["files_quota"], row["files_limit"]) if x > 0]
    return {
        "who": who,
        "command": command,
        "limit_gb": min(limits) * 1024 / 1e9 if limits else None,
        "left_gb": max(0.0, (min(limits) - row["used"]) * 1024 / 1e9) if limits else None,
        "files": row["files"],
        "over_files": bool(flimits) and row["files"] >= min(flimits),
    }


_NUMBER = re.compile(r"^\[?(\d+)\*?\]?$")  # a count, "*" where over a limit, "[...]" on lfs's per-target rows
_GRACE = re.compile(r"^(\[?-\]?|none|\d+(days?|[wdhms])\w*|\d+:\d+(:\d+)?)$", re.IGNORECASE)  # "-", "6d23h59m58s"


def parse_quota(text: str) -> list[dict]:
    """The rows of ``lfs quota`` or ``quota -w`` output: ``{"filesystem", "used", "quota", "limit", "over",
    "files", "files_quota", "files_limit", "files_over"}``, sizes in kbytes (1 KiB blocks), 0 for no limit, ``over``
    where a value carries ``*``. A row may be wrapped after a long file system name (lfs); a grace column may be
    empty (``quota`` prints none below the soft limit) or ``-``."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.split()[:1] == ["Filesystem"]), None)
    if head is None:
        return []
    tokens = " ".join(lines[head + 1 :]).split()
    rows = []
    while tokens:
        name = tokens.pop(0)
        values: list[str] = []
        stars = []
        for _ in range(2):  # blocks, then files: used, soft, hard[, grace]
            if len(tokens) < 3 or not all(_NUMBER.match(t) for t in tokens[:3]):
                return rows
            used, soft, hard = (tokens.pop(0) for _ in range(3))
            stars.append("*" in used)
            values += [_NUMBER.match(t)[1] for t in (used, soft, hard)]
            if tokens and _GRACE.match(tokens[0]):
                tokens.pop(0)  # the grace period: "-", "none", "6d23h59m58s", "6days", "00:30"
        used, soft, hard, files, fsoft, fhard = (int(v) for v in values)
        rows.append(
            {
                "filesystem": name,
                "used": used,
                "quota": soft,
                "limit": hard,
                "over": stars[0],
                "files": files,
                "files_quota": fsoft,
                "files_limit": fhard,
                "files_over": stars[1],
            }
        )
    return rows


def _run(argv: list[str]) -> str:
    """A command's stdout ("" where it is missing, fails to start or hangs: NFS quota servers may not answer)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


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
