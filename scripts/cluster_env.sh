#!/usr/bin/env bash
# The GPU environment of the cluster jobs: a venv on the shared file system, built once on the login node.
#
#   scripts/cluster_env.sh build [TRAINER]   check, then create the trainer's venv and install everything (login
#                                   node, no GPU)
#   scripts/cluster_env.sh check [TRAINER]   resolve the trainer's pinned stack + this package against the index,
#                                   install nothing
#   scripts/cluster_env.sh env [TRAINER]     the venv and the requirements file build and check would use
#                                   (venv=..., requirements=...)
#   scripts/cluster_env.sh python   the Python build and check would use, and its version (exit 3 if none fits)
#   scripts/cluster_env.sh post     the steps after the one pip pass, in the python on PATH (also the conda
#                                   post-deploy of envs/cluster-*.yaml): flash-attn wheel, OpenRLHF, checks
#   scripts/cluster_env.sh wheel-name [TORCH CUDA ABI PYTAG [PLATFORM]]
#                                   the flash-attn wheel names for the torch of the python on PATH, or for the
#                                   one given (e.g. 2.13.0 13.0 TRUE cp311): release_wheel (as flash-attn's
#                                   setup.py names it), release_url (empty where flash-attn publishes none),
#                                   build_label (the local version a wheel built here carries), why
#   scripts/cluster_env.sh find-wheel [TORCH CUDA ABI PYTAG [PLATFORM]]
#                                   the wheel in the cache for that torch; exit 1 (and why, on stderr) if none
#
# TRAINER: a grid.trainer whose backend has a GPU side (calibrl.backends.GpuSide) [openrlhf]. Its venv and its
# requirements file are the GPU side's `venv` and `requirements` (paths under this checkout: OpenRLHF's .venv-gpu
# and envs/cluster-gpu.txt), read from the backend's source where they are string literals (nothing imported: this
# Python need not have the package's requirements), else from the backend imported in it; CALIBRL_GPU_VENV and
# CALIBRL_GPU_REQUIREMENTS replace them.
#
# What goes in: the requirements file (OpenRLHF's: torch, vLLM, OpenRLHF 0.11.2's own requirements, the SLURM
# job-step plugin) and this checkout (editable), in one pip pass; then flash-attn from a prebuilt wheel, never
# compiled here; then OpenRLHF 0.11.2 without its requirements (all installed already; its pin flash-attn==2.8.3
# would make pip compile flash-attn from the sdist, the only thing PyPI has). The workflow makes every SLURM job of
# a grid whose trainer is TRAINER run in this venv (it sets CALIBRL_GPU_VENV, and slurm/config.yaml's precommand
# puts its bin/ first on PATH).
#
# flash-attn: OpenRLHF cannot run without it (openrlhf/models/ring_attn_utils.py imports it; packing forces
# flash_attention_2). `post` installs, in this order: FLASH_ATTN_WHEEL if set; else the wheel in the cache
# $CALIBRL_WHEELS that matches the installed torch exactly (flash-attn version, CUDA major, torch major.minor,
# C++11 ABI, CPython tag, platform: a wheel built for another torch is never picked); else flash-attn's release
# wheel, where one exists (2.8.3: torch 2.4-2.8 with CUDA 12 only); else it stops. PyPI's torch 2.13.0 is a
# CUDA 13.0 build that no release wheel covers: then build the wheel once, as a SLURM job on a GPU node
# (`sbatch scripts/build_flash_attn.sh`, from this checkout's root; it needs the CUDA 13 toolkit there), which
# puts it into the cache and installs it; then run `build` (or `post`) again. Before stopping, `post` downloads
# flash-attn's sdist into the cache, so that the build job needs no index.
#
# Python: before anything else, `build` and `check` find a CPython 3.11 or 3.12 and ask it its version: CALIBRL_PYTHON
# or PYTHON if set (only that one), else the first of python3.12, python3.11, python3.10, python3 on PATH that fits;
# every later step (the checks, the resolution, the venv) runs in it or in the venv made with it. None fits: exit 3,
# naming the versions seen and how to get one (module load, uv python install, the distribution's package). Why
# not 3.10: snakemake 9.27.1 and snakemake-executor-plugin-slurm-jobstep, which run every SLURM job in the venv
# (`python -m snakemake`), and this package require >= 3.11 (the GPU stack alone, torch 2.13.0, vLLM 0.29.0,
# OpenRLHF 0.11.2, Ray 2.55.0, transformers 5.15.0, has cp310 wheels). Why not 3.13+: OpenRLHF 0.11.2 publishes
# wheels for CPython 3.10-3.12 only, and no sdist.
#
# `check` runs the resolution a `build` would do, for the cluster (that Python's version, manylinux_2_28 x86_64,
# PyPI's torch, i.e. the CUDA build), and compares the OpenRLHF block of the requirements (where they have one,
# as envs/cluster-gpu.txt does) with the Requires-Dist of the openrlhf==0.11.2 wheel. With uv (UV, or `uv` on
# PATH) the target platform is explicit and the run takes seconds; with pip (`pip install --dry-run --report`,
# minutes) it is the found interpreter's, which must then run on Linux x86_64. The pinned set is written to
# $CHECK_OUT/cluster-gpu.lock.txt.
#
# Environment (all optional):
#   CALIBRL_GPU_VENV    the venv                              [<repo>/<the trainer's venv>: .venv-gpu]
#   CALIBRL_GPU_REQUIREMENTS  the requirements file     [<repo>/<the trainer's requirements>: envs/cluster-gpu.txt]
#   CALIBRL_PYTHON, PYTHON  the CPython 3.11 or 3.12 (name or path) for the venv and the checks
#                       [the first that fits of python3.12, python3.11, python3.10, python3 on PATH]
#   INDEX_URL           package index                                        [https://pypi.org/simple]
#   UV                  uv binary for `check`                                [uv on PATH, else pip]
#   CHECK_OUT           where `check` writes its lock file                   [a temporary folder]
#   FLASH_ATTN_WHEEL    path or URL of a flash-attn wheel for this torch/CUDA/Python (skips the cache)
#   CALIBRL_WHEELS      the flash-attn wheel cache, on the shared file system  [<repo>/.wheels]
#   FLASH_ATTN_VERSION  [2.8.3, OpenRLHF 0.11.2's pin]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TRAINER=openrlhf  # build|check|env TRAINER
REQUIREMENTS=     # the trainer's (backend_env)
VENV=
OPENRLHF=openrlhf==0.11.2
INDEX_URL=${INDEX_URL:-https://pypi.org/simple}
FLASH_ATTN_VERSION=${FLASH_ATTN_VERSION:-2.8.3}
WHEELS=${CALIBRL_WHEELS:-$REPO/.wheels}

die() {
    echo "cluster_env.sh: $*" >&2
    exit 1
}

# ------------------------------------------------------------------------------------------------ python
# PY: the interpreter of every step, PY_VERSION its X.Y as it reports it; found before anything else (find_python).
PY=
PY_VERSION=

python_version() {  # X.Y of an interpreter, as it reports itself (any Python answers -V; Python 2 on stderr)
    local out
    out=$("$1" -V 2>&1 < /dev/null) || return 1
    sed -n 's/^Python \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p' <<< "$out" | head -n 1
}

python_fits() {  # python_fits X.Y: nothing if the GPU venv can be made with it, else why not
    local major=${1%%.*} minor=${1#*.}
    if ! [[ $1 =~ ^[0-9]+\.[0-9]+$ ]]; then
        echo "version ${1:-unknown}"
    elif [ "$major" != 3 ]; then
        echo "$1: not Python 3"
    elif [ "$minor" -lt 10 ]; then
        echo "$1, below 3.10, which every package of the stack needs"
    elif [ "$minor" -eq 10 ]; then
        echo "3.10: snakemake 9.27.1 and snakemake-executor-plugin-slurm-jobstep (every SLURM job runs in the venv) and this package require >= 3.11"
    elif [ "$minor" -gt 12 ]; then
        echo "$1: OpenRLHF 0.11.2 publishes wheels for CPython 3.10-3.12 only"
    fi
}

find_python() {  # sets PY and PY_VERSION, or exits 3 naming what it saw and how to get a Python that fits
    local explicit=${CALIBRL_PYTHON:-${PYTHON:-}} from="" name path version why
    local candidates=(python3.12 python3.11 python3.10 python3) seen=()
    if [ -n "$explicit" ]; then
        from=PYTHON
        [ -n "${CALIBRL_PYTHON:-}" ] && from=CALIBRL_PYTHON
        candidates=("$explicit")
    fi
    for name in "${candidates[@]}"; do
        if ! path=$(command -v "$name"); then
            [ -z "$explicit" ] || seen+=("$from=$name: not found")
            continue
        fi
        version=$(python_version "$path") || version=""
        why=$(python_fits "$version")
        if [ -z "$why" ] && ! "$path" -c 'import sys; sys.exit(sys.implementation.name != "cpython")' 2> /dev/null; then
            why="$version, not CPython (the stack's wheels are CPython's)"
        fi
        if [ -z "$why" ]; then
            PY=$path PY_VERSION=$version
            echo "cluster_env.sh: Python $PY_VERSION at $PY${from:+ ($from)}" >&2
            return
        fi
        seen+=("$path: $why")
    done
    [ ${#seen[@]} -gt 0 ] || seen=("no python3.12, python3.11, python3.10 or python3 on PATH")
    {
        echo "cluster_env.sh: no CPython 3.11 or 3.12${from:+ in $from}, which the jobs' venv and these checks need. Seen:"
        printf '    %s\n' "${seen[@]}"
        cat << 'EOF'
Get a CPython 3.11 (or 3.12), then run this again (PYTHON=/path/to/python3.11 where it is not on PATH):
    module load python/3.11                      an HPC site's module (`module avail python` lists them)
    uv python install 3.11                       uv's own build, no root; then PYTHON=$(uv python find 3.11)
    dnf install python3.11 python3.11-pip        RHEL, Rocky, Alma 8.8+ and 9.2+
    apt install python3.11 python3.11-venv       Debian, Ubuntu (22.04: universe)
Not 3.10: snakemake 9.27.1 and snakemake-executor-plugin-slurm-jobstep, which run every SLURM job in the venv,
and this package require >= 3.11 (torch 2.13.0, vLLM 0.29.0, OpenRLHF 0.11.2 and Ray 2.55.0 alone would take
3.10). Not 3.13+: OpenRLHF 0.11.2 publishes wheels for CPython 3.10-3.12 only.
EOF
    } >&2
    exit 3
}

pip_python() {  # pip_python TMP: a Python PY_VERSION with pip: PY itself, else a venv made with it under TMP
    if "$PY" -m pip --version > /dev/null 2>&1; then
        echo "$PY"
    elif "$PY" -c 'import venv, ensurepip' 2> /dev/null && "$PY" -m venv "$1/pyvenv" > /dev/null 2>&1; then
        echo "$1/pyvenv/bin/python"
    else
        die "$PY has neither pip nor a way to make a venv (ensurepip): install its pip or venv package
(python$PY_VERSION-pip on RHEL, python$PY_VERSION-venv on Debian/Ubuntu), or name another Python with PYTHON="
    fi
}

# ------------------------------------------------------------------------------------------------ the trainer's
backend_env() {  # sets VENV and REQUIREMENTS: TRAINER's GpuSide.venv and .requirements, unless the variables are set
    local out=
    if [ -n "${CALIBRL_GPU_VENV:-}" ] && [ -n "${CALIBRL_GPU_REQUIREMENTS:-}" ]; then
        VENV=$CALIBRL_GPU_VENV REQUIREMENTS=$CALIBRL_GPU_REQUIREMENTS
        return
    fi
    out=$("$PY" - "$REPO/src/calibrl/backends" "$TRAINER" <<'PY'
import ast, pathlib, sys

root, name = pathlib.Path(sys.argv[1]), sys.argv[2]
names = sorted(p.parent.name for p in root.glob("*/__init__.py"))
if name not in names:
    sys.exit(f"cluster_env.sh: unknown trainer {name!r}; the backends are {names}")


def literals() -> dict | None:
    """The one class of the backend's folder that declares both as string literals, read without importing
    anything (this Python need not have the package's requirements); None where there is not exactly one."""
    found = []
    for path in sorted((root / name).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            strings = {}  # its class attributes that are string literals
            for stmt in node.body:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
                if isinstance(target, ast.Name) and isinstance(getattr(stmt, "value", None), ast.Constant):
                    if isinstance(stmt.value.value, str):
                        strings[target.id] = stmt.value.value
            if {"venv", "requirements"} <= strings.keys():
                found.append(strings)
    return found[0] if len(found) == 1 else None


def imported() -> dict:
    """Else the backend's GPU side itself, imported (its module-level imports must then be in this Python)."""
    sys.path.insert(0, str(root.parent.parent))
    from calibrl import backends

    gpu = backends.get(name).gpu
    if gpu is None:
        sys.exit(f"cluster_env.sh: trainer {name} has no GPU side (calibrl.backends.GpuSide): its jobs need no GPU venv")
    return {"venv": gpu.venv, "requirements": gpu.requirements}


try:
    side = literals() or imported()
except ImportError as err:
    sys.exit(f"cluster_env.sh: trainer {name}'s folder declares no venv and requirements as string literals, and "
             f"importing it in {sys.executable} failed ({err}): set CALIBRL_GPU_VENV and CALIBRL_GPU_REQUIREMENTS")
print(f"venv={side['venv']}\nrequirements={side['requirements']}")
PY
    ) || exit 1
    VENV=${CALIBRL_GPU_VENV:-$REPO/$(field venv "$out")}
    REQUIREMENTS=${CALIBRL_GPU_REQUIREMENTS:-$REPO/$(field requirements "$out")}
}

# ------------------------------------------------------------------------------------------------ check
# OpenRLHF's Requires-Dist (no extras, flash-attn left out) must be the block between the >>> / <<< lines.
compare_with_openrlhf() {
    local tmp=$1
    if ! grep -q '^# >>> openrlhf' "$REQUIREMENTS"; then
        echo "cluster_env.sh: $REQUIREMENTS has no OpenRLHF block: nothing to compare with the openrlhf wheel" >&2
        return
    fi
    "$PIP_PY" -m pip download --isolated --quiet --disable-pip-version-check --no-deps --index-url "$INDEX_URL" -d "$tmp/openrlhf" "$OPENRLHF" ||
        die "cannot download $OPENRLHF from $INDEX_URL with $PIP_PY (Python $PY_VERSION; the check needs the network to the index)"
    "$PY" - "$REQUIREMENTS" "$tmp"/openrlhf/*.whl <<'PY'
import re, sys, zipfile

def norm(req):
    return re.sub(r"\s+", "", req).lower().replace("_", "-")

lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith("# >>> openrlhf"))
end = next(i for i, l in enumerate(lines) if l.startswith("# <<< openrlhf"))
ours = {norm(l) for l in lines[start + 1 : end] if l.strip() and not l.startswith("#")}
with zipfile.ZipFile(sys.argv[2]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [l.split(":", 1)[1].strip() for l in whl.read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
theirs = {norm(r) for r in reqs if "extra==" not in norm(r) and not norm(r).startswith("flash-attn")}
extra_vllm = [r for r in reqs if 'extra == "vllm"' in r]
missing, surplus = sorted(theirs - ours), sorted(ours - theirs)
if missing or surplus:
    sys.exit(f"{sys.argv[1]} differs from {sys.argv[2].rsplit('/', 1)[-1]}: missing {missing}, not required {surplus}")
print(f"OpenRLHF block matches the wheel's {len(theirs)} requirements (flash-attn aside); its vllm extra: {extra_vllm}")
PY
}

resolve() {  # resolve OUT: the pinned set of the requirements + this checkout, written to OUT
    local out=$1 tmp=$2 uv=${UV:-$(command -v uv || true)}
    printf -- '-r %s\n-e %s\n' "$REQUIREMENTS" "$REPO" > "$tmp/in.txt"
    if [ -n "$uv" ]; then
        echo "resolving with $("$uv" --version) for CPython $PY_VERSION / x86_64-manylinux_2_28 against $INDEX_URL" >&2
        "$uv" pip compile --quiet --no-config --no-header --no-annotate --index-url "$INDEX_URL" \
            --python-version "$PY_VERSION" --python-platform x86_64-manylinux_2_28 "$tmp/in.txt" -o "$out"
    else
        "$PY" - <<'PY' || die "without uv, the check resolves for $PY itself: it must run on Linux x86_64 (the nodes' platform)"
import platform, sys
sys.exit(not (sys.platform == "linux" and platform.machine() == "x86_64"))
PY
        echo "resolving with $("$PIP_PY" -m pip --version | cut -d' ' -f1-2) for Python $PY_VERSION ($PY) against $INDEX_URL" >&2
        "$PIP_PY" -m pip install --isolated --quiet --disable-pip-version-check --dry-run --ignore-installed --index-url "$INDEX_URL" \
            --report "$tmp/report.json" -r "$tmp/in.txt"
        "$PY" - "$tmp/report.json" "$out" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["install"]
pins = sorted(f"{i['metadata']['name'].lower()}=={i['metadata']['version']}" for i in items)
open(sys.argv[2], "w").write("\n".join(pins) + "\n")
PY
    fi
}

summarise() {  # summarise LOCK: the requirements file's pins, found in the lock file
    "$PY" - "$1" "$REQUIREMENTS" <<'PY'
import re, sys
pins = {}
for line in open(sys.argv[1]):
    m = re.match(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line.strip())
    if m:
        pins[re.sub(r"\[.*\]", "", m[1]).lower().replace("_", "-")] = m[2]
    elif line.strip().startswith("-e "):
        pins["calibrl"] = "editable: " + line.split(None, 1)[1].strip()
# every pin of the requirements file, as the resolution must keep it
want = {}
for line in open(sys.argv[2]):
    m = re.match(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;#]+)", line.strip())
    if m:
        want[re.sub(r"\[.*\]", "", m[1]).lower().replace("_", "-")] = m[2]
bad = {k: pins.get(k) for k, v in want.items() if pins.get(k) != v}
if bad or "calibrl" not in pins:
    sys.exit(f"resolved set lacks the pins {want}: got {bad}, calibrl {pins.get('calibrl')}")
cuda = pins.get("nvidia-cuda-runtime") or pins.get("nvidia-cuda-runtime-cu12")
print(f"{len(pins)} packages; " + ", ".join(f"{k} {pins.get(k)}" for k in [*want, "numpy", "calibrl"]))
print(f"torch is the CUDA build (nvidia-cuda-runtime {cuda}); flash-attn: {pins.get('flash-attn', 'not in the set')}")
PY
}

check() {  # in PY (find_python first)
    local tmp out PIP_PY
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    out=${CHECK_OUT:-$tmp}/cluster-gpu.lock.txt
    mkdir -p "$(dirname "$out")"
    PIP_PY=$(pip_python "$tmp") || exit 1
    compare_with_openrlhf "$tmp"
    resolve "$out" "$tmp" || die "the pinned stack does not resolve against $INDEX_URL (see above)"
    summarise "$out"
    echo "cluster_env.sh: the pinned stack resolves with this package ($out)" >&2
}

# ------------------------------------------------------------------------------------------------ build
# The flash-attn wheel for a torch, in the python on PATH: flash_attn_py name|find [TORCH CUDA ABI PYTAG [PLATFORM]];
# without the torch arguments, those of the installed torch and of this interpreter.
flash_attn_py() {
    local mode=$1
    shift
    python - "$mode" "$FLASH_ATTN_VERSION" "$WHEELS" "$@" <<'PY'
import os, platform, re, sys

mode, version, cache, *given = sys.argv[1:]
if given:
    torch_version, cuda, abi, py, *plat = given
    plat = plat[0] if plat else f"linux_{platform.machine()}"
else:
    import torch

    torch_version, cuda = torch.__version__, torch.version.cuda or ""
    abi = str(torch._C._GLIBCXX_USE_CXX11_ABI)
    py, plat = f"cp{sys.version_info.major}{sys.version_info.minor}", f"linux_{platform.machine()}"
m = re.match(r"(\d+)\.(\d+)", torch_version)
if not m:
    sys.exit(f"cannot read the torch version {torch_version!r}")
torch_mm = f"{m[1]}.{m[2]}"
if not re.match(r"\d+(\.\d+)*$", cuda):
    sys.exit(f"torch {torch_version} has no CUDA (torch.version.cuda is {cuda or None}): a CPU build, not the cluster's")
cuda_major = int(cuda.split(".")[0])
abi = {"true": "TRUE", "1": "TRUE", "false": "FALSE", "0": "FALSE"}.get(abi.lower()) or sys.exit(f"ABI {abi!r}: TRUE or FALSE")
# flash-attn's setup.py (get_wheel_url): `parse("11.8") if major == 11 else parse("12.3")`, so every CUDA >= 12 is cu12
release = f"flash_attn-{version}+cu{11 if cuda_major == 11 else 12}torch{torch_mm}cxx11abi{abi}-{py}-{py}-{plat}.whl"
url = f"https://github.com/Dao-AILab/flash-attention/releases/download/v{version}/{release}"
# 2.8.3's release wheels (.github/workflows/publish.yml at v2.8.3): torch 2.4.0, 2.5.1, 2.6.0, 2.7.1, 2.8.0 x CPython
# 3.9-3.13 (torch 2.4: to 3.12) x CUDA 12.9 x cxx11abi TRUE/FALSE, linux_x86_64. Other versions: not known here.
published = version != "2.8.3" or (
    cuda_major == 12 and plat == "linux_x86_64" and torch_mm in ("2.4", "2.5", "2.6", "2.7", "2.8")
    and py in ("cp39", "cp310", "cp311", "cp312", "cp313") and (torch_mm, py) != ("2.4", "cp313")
)
why = (
    "" if published else f"flash-attn {version} publishes no wheel for torch {torch_mm} with CUDA {cuda} and {py} "
    f"(its release wheels: torch 2.4-2.8, CUDA 12, cp39-cp313, linux_x86_64; setup.py would guess {release})"
)
# A wheel built here carries this local version (FLASH_ATTN_LOCAL_VERSION; the wheel's name has it lower-cased).
label = f"cu{cuda_major}torch{torch_mm}cxx11abi{abi}"
if mode == "name":
    print(f"release_wheel={release}\nrelease_url={url if published else ''}\nbuild_label={label}\ncuda={cuda}\nwhy={why}")
    sys.exit()
want = (version, label.lower(), py, py, plat)
hits = []
for name in sorted(os.listdir(cache)) if os.path.isdir(cache) else []:
    w = re.fullmatch(r"flash_attn-([^-+]+)(?:\+([^-]+))?(?:-\d[^-]*)?-([^-]+)-([^-]+)-([^-]+)\.whl", name)
    if not w:
        continue
    if w[1] == version and (w[2] or "").lower() == want[1] and w.groups()[2:] == want[2:]:
        hits.append(os.path.join(cache, name))
    else:
        print(f"{cache}: not {name} (this torch needs {version}+{label} {py} {plat})", file=sys.stderr)
if not hits:
    sys.exit(1)
print(max(hits, key=os.path.getmtime))
PY
}

field() { sed -n "s/^$1=//p" <<< "$2"; }

cache_dir() {  # the wheel cache, created, and ignored by git where it sits inside a checkout
    mkdir -p "$WHEELS"
    [ -e "$WHEELS/.gitignore" ] || echo '*' > "$WHEELS/.gitignore"
}

fetch_sdist() {  # flash-attn's sdist into the cache, for a build job on a node without the index (best effort)
    ls "$WHEELS"/flash[-_]attn-"$FLASH_ATTN_VERSION".tar.gz > /dev/null 2>&1 && return
    cache_dir
    # its setup.py imports torch (no build isolation) and skips the CUDA part only with SKIP_CUDA_BUILD
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTN_LOCAL_VERSION='' python -m pip download --quiet \
        --disable-pip-version-check --no-deps --no-build-isolation --no-binary :all: --index-url "$INDEX_URL" \
        -d "$WHEELS" "flash-attn==$FLASH_ATTN_VERSION" > /dev/null 2>&1 &&
        echo "cluster_env.sh: downloaded flash-attn $FLASH_ATTN_VERSION's sdist into $WHEELS for the build job" >&2 ||
        echo "cluster_env.sh: could not download flash-attn's sdist (the build job then needs the index)" >&2
}

flash_attn_source() {  # where `post` installs flash-attn from; stops with what to do where there is none
    local info url
    if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
        echo "$FLASH_ATTN_WHEEL"
        return
    fi
    info=$(flash_attn_py name) || die "no flash-attn wheel can match this torch (above)"
    flash_attn_py find && return
    url=$(field release_url "$info")
    if [ -n "$url" ]; then
        echo "$url"
        return
    fi
    fetch_sdist
    die "$(field why "$info"), and $WHEELS has none built for it ($(field build_label "$info")).
Build it once, as a SLURM job on a GPU node with the CUDA $(field cuda "$info") toolkit:
    cd $REPO && sbatch scripts/build_flash_attn.sh     (partition etc.: sbatch -p/-A/-t; see the script)
It puts the wheel into $WHEELS (CALIBRL_WHEELS) and installs it into $(dirname "$(dirname "$(command -v python)")");
then run scripts/cluster_env.sh build (or post) again. Or set FLASH_ATTN_WHEEL=<a .whl built for this torch>.
OpenRLHF 0.11.2 cannot run without flash-attn (openrlhf.models imports it)"
}

# What `post` does after the pip pass is the requirements file's to say, in comment lines (so each backend's file
# carries its own steps): `# cluster_env: flash-attn` (flash-attn from a prebuilt wheel, above), `# cluster_env:
# no-deps PKG==V` (installed without its requirements, after flash-attn), `# cluster_env: import MOD...` (the imports
# that must work at the end).
directive() { sed -n "s/^# cluster_env: $1\( \|$\)//p" "$REQUIREMENTS"; }

post() {  # in the environment whose python is first on PATH
    local wheel pkg modules
    if grep -q '^# cluster_env: flash-attn$' "$REQUIREMENTS"; then
        wheel=$(flash_attn_source) || exit 1
        echo "flash-attn from $wheel" >&2
        python -m pip install --no-deps "$wheel" || die "cannot install flash-attn from $wheel (from a node without \
GitHub, download it into $WHEELS; or build one: cd $REPO && sbatch scripts/build_flash_attn.sh)"
    fi
    for pkg in $(directive no-deps); do
        python -m pip install --no-deps --index-url "$INDEX_URL" "$pkg"
    done
    python -m pip show calibrl > /dev/null 2>&1 || python -m pip install -e "$REPO"   # conda: not in its pip pass
    python -m pip check
    modules=$(directive import | tr ' ' '\n' | sed '/^$/d' | paste -sd, -)
    python -c "import ${modules:-calibrl}; print('imports ok: ${modules:-calibrl}')"
}

build() {  # in PY (find_python first), then in the venv made with it
    local version why
    if [ -x "$VENV/bin/python" ]; then  # made before: it must be a version the stack takes, too
        version=$(python_version "$VENV/bin/python") || version=unknown
        why=$(python_fits "${version:-unknown}")
        [ -z "$why" ] || die "$VENV is Python ${version:-unknown} ($why): remove it (rm -rf $VENV) and run build again"
    else
        "$PY" -c 'import venv, ensurepip' 2> /dev/null || die "$PY cannot make a venv (no ensurepip): install
python$PY_VERSION-venv (Debian/Ubuntu) or its pip package, or name another Python with PYTHON="
    fi
    check
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --index-url "$INDEX_URL" -r "$REQUIREMENTS" -e "$REPO"
    PATH="$VENV/bin:$PATH" post
    echo "cluster_env.sh: $VENV is ready; the workflow runs the SLURM jobs of grid.trainer $TRAINER in it" >&2
}

case ${1:-} in
    check | build | env)
        TRAINER=${2:-$TRAINER}
        find_python
        backend_env
        if [ "$1" = env ]; then
            printf 'venv=%s\nrequirements=%s\n' "$VENV" "$REQUIREMENTS"
        else
            "$1"
        fi
        ;;
    python)
        find_python
        echo "$PY"
        echo "$PY_VERSION"
        ;;
    post)  # post [TRAINER]: the conda post-deploy scripts run it in the new environment
        TRAINER=${2:-$TRAINER}
        find_python
        backend_env
        post
        ;;
    wheel-name) flash_attn_py name "${@:2}" ;;
    find-wheel) flash_attn_py find "${@:2}" ;;
    *)
        echo "usage: $0 build|check|env [TRAINER] | python|post|wheel-name|find-wheel" >&2
        exit 2
        ;;
esac
