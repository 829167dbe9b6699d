#!/usr/bin/env bash
# The GPU environment of the cluster jobs: a venv on the shared file system, built once on the login node.
#
#   scripts/cluster_env.sh build    check, then create $CALIBRL_GPU_VENV and install everything (login node, no GPU)
#   scripts/cluster_env.sh check    resolve the pinned stack + this package against the index, install nothing
#   scripts/cluster_env.sh post     the steps after the one pip pass, in the python on PATH (also the conda
#                                   post-deploy of envs/cluster-*.yaml): flash-attn wheel, OpenRLHF, checks
#
# What goes in: envs/cluster-gpu.txt (torch, vLLM, OpenRLHF 0.11.2's own requirements, the SLURM job-step
# plugin) and this checkout (editable), in one pip pass; then flash-attn from a prebuilt wheel, never compiled;
# then OpenRLHF 0.11.2 without its requirements (all installed already; its pin flash-attn==2.8.3 would make pip
# compile flash-attn from the sdist, the only thing PyPI has). slurm/config.yaml makes every SLURM job run in
# this venv (precommand puts its bin/ first on PATH).
#
# `check` runs the resolution a `build` would do, for the cluster (CPython 3.11, manylinux_2_28 x86_64, PyPI's
# torch, i.e. the CUDA build), and compares the OpenRLHF block of envs/cluster-gpu.txt with the Requires-Dist
# of the openrlhf==0.11.2 wheel. With uv (UV, or `uv` on PATH) the target platform is explicit and the run
# takes seconds; with pip (`pip install --dry-run --report`, minutes) it is this machine's interpreter, which
# must then be CPython 3.11 on Linux x86_64. The pinned set is written to $CHECK_OUT/cluster-gpu.lock.txt.
#
# Environment (all optional):
#   CALIBRL_GPU_VENV    the venv                                             [<repo>/.venv-gpu]
#   CALIBRL_GPU_REQUIREMENTS  the requirements file                          [<repo>/envs/cluster-gpu.txt]
#   PYTHON              python 3.11 that creates the venv                    [python3.11]
#   INDEX_URL           package index                                        [https://pypi.org/simple]
#   UV                  uv binary for `check`                                [uv on PATH, else pip]
#   CHECK_OUT           where `check` writes its lock file                   [a temporary folder]
#   FLASH_ATTN_WHEEL    path or URL of a flash-attn wheel for this torch/CUDA/Python; default: the release
#                       wheel that flash-attn's own setup.py would download for the installed torch
#   FLASH_ATTN_VERSION  [2.8.3, OpenRLHF 0.11.2's pin]
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQUIREMENTS=${CALIBRL_GPU_REQUIREMENTS:-$REPO/envs/cluster-gpu.txt}
OPENRLHF=openrlhf==0.11.2
INDEX_URL=${INDEX_URL:-https://pypi.org/simple}
VENV=${CALIBRL_GPU_VENV:-$REPO/.venv-gpu}
FLASH_ATTN_VERSION=${FLASH_ATTN_VERSION:-2.8.3}

die() {
    echo "cluster_env.sh: $*" >&2
    exit 1
}

# ------------------------------------------------------------------------------------------------ check
# OpenRLHF's Requires-Dist (no extras, flash-attn left out) must be the block between the >>> / <<< lines.
compare_with_openrlhf() {
    local tmp=$1
    python3 -m pip download --isolated --quiet --disable-pip-version-check --no-deps --index-url "$INDEX_URL" -d "$tmp/openrlhf" "$OPENRLHF" ||
        die "cannot download $OPENRLHF from $INDEX_URL (the check needs the network to the index)"
    python3 - "$REQUIREMENTS" "$tmp"/openrlhf/*.whl <<'PY'
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
    sys.exit(f"envs/cluster-gpu.txt differs from {sys.argv[2].rsplit('/', 1)[-1]}: missing {missing}, not required {surplus}")
print(f"OpenRLHF block matches the wheel's {len(theirs)} requirements (flash-attn aside); its vllm extra: {extra_vllm}")
PY
}

resolve() {  # resolve OUT: the pinned set of envs/cluster-gpu.txt + this checkout, written to OUT
    local out=$1 tmp=$2 uv=${UV:-$(command -v uv || true)}
    printf -- '-r %s\n-e %s\n' "$REQUIREMENTS" "$REPO" > "$tmp/in.txt"
    if [ -n "$uv" ]; then
        echo "resolving with $("$uv" --version) for CPython 3.11 / x86_64-manylinux_2_28 against $INDEX_URL" >&2
        "$uv" pip compile --quiet --no-config --no-header --no-annotate --index-url "$INDEX_URL" \
            --python-version 3.11 --python-platform x86_64-manylinux_2_28 "$tmp/in.txt" -o "$out"
    else
        python3 - <<'PY' || die "without uv, the check resolves for this interpreter: it must be CPython 3.11 on Linux x86_64"
import platform, sys
sys.exit(not (sys.version_info[:2] == (3, 11) and sys.platform == "linux" and platform.machine() == "x86_64"))
PY
        echo "resolving with $(python3 -m pip --version | cut -d' ' -f1-2) for this interpreter against $INDEX_URL" >&2
        python3 -m pip install --isolated --quiet --disable-pip-version-check --dry-run --ignore-installed --index-url "$INDEX_URL" \
            --report "$tmp/report.json" -r "$tmp/in.txt"
        python3 - "$tmp/report.json" "$out" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["install"]
pins = sorted(f"{i['metadata']['name'].lower()}=={i['metadata']['version']}" for i in items)
open(sys.argv[2], "w").write("\n".join(pins) + "\n")
PY
    fi
}

summarise() {  # the pins that matter, from a lock file
    python3 - "$1" <<'PY'
import re, sys
pins = {}
for line in open(sys.argv[1]):
    m = re.match(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line.strip())
    if m:
        pins[re.sub(r"\[.*\]", "", m[1]).lower().replace("_", "-")] = m[2]
    elif line.strip().startswith("-e "):
        pins["calibrl"] = "editable: " + line.split(None, 1)[1].strip()
want = {"torch": "2.13.0", "vllm": "0.29.0", "ray": "2.55.0", "deepspeed": "0.19.6", "transformers": "5.15.0"}
bad = {k: pins.get(k) for k, v in want.items() if pins.get(k) != v}
if bad or "calibrl" not in pins:
    sys.exit(f"resolved set lacks the pins {want}: got {bad}, calibrl {pins.get('calibrl')}")
cuda = pins.get("nvidia-cuda-runtime") or pins.get("nvidia-cuda-runtime-cu12")
print(f"{len(pins)} packages; " + ", ".join(f"{k} {pins[k]}" for k in [*want, "numpy", "snakemake", "calibrl"]))
print(f"torch is the CUDA build (nvidia-cuda-runtime {cuda}); flash-attn: {pins.get('flash-attn', 'not in the set')}")
PY
}

check() {
    local tmp out
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    out=${CHECK_OUT:-$tmp}/cluster-gpu.lock.txt
    mkdir -p "$(dirname "$out")"
    compare_with_openrlhf "$tmp"
    resolve "$out" "$tmp" || die "the pinned stack does not resolve against $INDEX_URL (see above)"
    summarise "$out"
    echo "cluster_env.sh: the pinned stack resolves with this package ($out)" >&2
}

# ------------------------------------------------------------------------------------------------ build
flash_attn_wheel() {  # the wheel for the installed torch, named as flash-attn's setup.py names its release wheels
    python - "$FLASH_ATTN_VERSION" <<'PY'
import platform, sys
import torch
v = sys.argv[1]
t = ".".join(torch.__version__.split("+")[0].split(".")[:2])
cuda = (torch.version.cuda or "").split(".")[0]
if not cuda:
    sys.exit("the installed torch has no CUDA: it is not the cluster build")
abi = str(torch._C._GLIBCXX_USE_CXX11_ABI).upper()
py = f"cp{sys.version_info.major}{sys.version_info.minor}"
name = f"flash_attn-{v}+cu{cuda}torch{t}cxx11abi{abi}-{py}-{py}-linux_{platform.machine()}.whl"
print(f"https://github.com/Dao-AILab/flash-attention/releases/download/v{v}/{name}")
PY
}

post() {  # in the environment whose python is first on PATH
    local wheel
    wheel=${FLASH_ATTN_WHEEL:-$(flash_attn_wheel)}
    echo "flash-attn from $wheel" >&2
    python -m pip install --no-deps "$wheel" || die "no flash-attn wheel at $wheel. Build one once on a GPU node of \
this cluster (MAX_JOBS=8 pip wheel --no-deps --no-build-isolation flash-attn==$FLASH_ATTN_VERSION, ~1 h) and \
set FLASH_ATTN_WHEEL=<that .whl>; OpenRLHF 0.11.2 cannot run without it (openrlhf.models imports flash_attn)"
    python -m pip install --no-deps --index-url "$INDEX_URL" "$OPENRLHF"
    python -m pip show calibrl > /dev/null 2>&1 || python -m pip install -e "$REPO"   # conda: not in its pip pass
    python -m pip check
    python -c "import flash_attn.bert_padding, openrlhf.models.actor, vllm, deepspeed, ray, calibrl; print('imports ok')"
}

build() {
    check
    [ -x "$VENV/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --index-url "$INDEX_URL" -r "$REQUIREMENTS" -e "$REPO"
    PATH="$VENV/bin:$PATH" post
    echo "cluster_env.sh: $VENV is ready; slurm/config.yaml runs the SLURM jobs in it" >&2
}

case ${1:-} in
    check | build | post) "$1" ;;
    *)
        echo "usage: $0 build|check|post" >&2
        exit 2
        ;;
esac
