#!/usr/bin/env bash
#SBATCH --job-name=flash-attn-build
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=16
#SBATCH --mem=160G
#SBATCH --time=03:00:00
#SBATCH --output=flash-attn-build-%j.out
#
# Builds the flash-attn wheel that OpenRLHF 0.11.2 needs (flash-attn==2.8.3) for the GPU venv's torch, once, on a
# GPU node, where the CUDA toolkit is (login nodes often lack it; no GPU is needed to compile, only nvcc). PyPI's
# torch 2.13.0 is a CUDA 13.0 build and flash-attn publishes wheels for torch 2.4-2.8 only, so the cluster
# compiles its own. The wheel goes into the cache that `scripts/cluster_env.sh post` installs from.
#
#   cd <this checkout> && sbatch scripts/build_flash_attn.sh            # the job: check, build, cache, install
#   sbatch -p <partition> -A <account> -t 3:00:00 scripts/build_flash_attn.sh   # flags replace the #SBATCH lines
#   scripts/build_flash_attn.sh                                          # the same in this shell (e.g. srun --pty)
#
# Order of work: first `scripts/cluster_env.sh build` on the login node (it makes the venv and stops at flash-attn,
# saying so, after putting flash-attn's sdist into the cache), then this job, then `scripts/cluster_env.sh build`
# again (it finds the wheel in the cache). sbatch's SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT also
# replace the #SBATCH lines above; the submitting shell's environment reaches the job (sbatch --export=ALL), so
# `module load cuda/13.0 && sbatch scripts/build_flash_attn.sh` gives the job the toolkit (or set CUDA_HOME).
#
# Before compiling, the job stops with the cause and the fix if: the venv's torch has no CUDA; there is no nvcc
# (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda: torch's own order), or its major version is not torch's CUDA
# major (torch refuses to compile then); there is no g++; ninja, packaging, psutil, einops, setuptools or wheel
# are missing and cannot be installed. A wheel for this torch already in the cache is installed, not rebuilt.
# Compiling: 72 CUDA kernels, one per parallel job, each 2-4.5 CPU-minutes and 3.5-7 GB for sm_90 (nvcc 13.0,
# measured per kernel), so an estimated 15-30 min on 16 CPUs; the wheel is built in a temporary folder of the
# cache and moved in when finished; then installed into the venv (pip install --no-deps) and imported
# (and run against torch's attention, where a GPU is visible).
#
# Environment (all optional):
#   CALIBRL_GPU_VENV       the venv to build for and install into        [<repo>/.venv-gpu]
#   CALIBRL_WHEELS         the wheel cache (shared file system)          [<repo>/.wheels]
#   CALIBRL_REPO           the checkout, where the job cannot tell       [the script's, else the submit folder]
#   FLASH_ATTN_CUDA_ARCHS  GPU architectures (flash-attn's own variable; TORCH_CUDA_ARCH_LIST is ignored)
#                          [90: H100/H200; e.g. "80;90" for A100 too]
#   NVCC_THREADS           nvcc threads per compile job                  [2]
#   MAX_JOBS               parallel compile jobs        [min(CPUs, memory GB / 9), at least 1]
#   CUDA_HOME              the CUDA toolkit (its major version must be torch's CUDA major: 13 for torch 2.13.0)
#   INDEX_URL              package index, where the build needs one      [https://pypi.org/simple]
#   FLASH_ATTN_VERSION     [2.8.3, OpenRLHF 0.11.2's pin]
set -euo pipefail

die() {
    echo "build_flash_attn.sh: error: $*" >&2
    exit 1
}
say() { echo "build_flash_attn.sh: $*" >&2; }

# sbatch runs a copy of this script from its spool folder: the checkout is then the folder it was submitted from
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${CALIBRL_REPO:-}" ]; then
    REPO=$CALIBRL_REPO
elif [ -f "$here/scripts/cluster_env.sh" ]; then
    REPO=$here
elif [ -f "${SLURM_SUBMIT_DIR:-/nonexistent}/scripts/cluster_env.sh" ]; then
    REPO=$SLURM_SUBMIT_DIR
else
    die "cannot find the checkout: submit from its root (cd <repo> && sbatch scripts/build_flash_attn.sh) or set CALIBRL_REPO"
fi
[ -f "$REPO/scripts/cluster_env.sh" ] || die "CALIBRL_REPO=$REPO has no scripts/cluster_env.sh"
VENV=${CALIBRL_GPU_VENV:-$REPO/.venv-gpu}
export CALIBRL_WHEELS=${CALIBRL_WHEELS:-$REPO/.wheels}
WHEELS=$CALIBRL_WHEELS
INDEX_URL=${INDEX_URL:-https://pypi.org/simple}
export FLASH_ATTN_VERSION=${FLASH_ATTN_VERSION:-2.8.3}
CLUSTER_ENV=$REPO/scripts/cluster_env.sh

say "$(date -Is) on $(hostname)${SLURM_JOB_ID:+, SLURM job $SLURM_JOB_ID}: flash-attn $FLASH_ATTN_VERSION for $VENV"
[ -x "$VENV/bin/python" ] || die "no venv at $VENV: run scripts/cluster_env.sh build on the login node first \
(it creates the venv and stops at flash-attn), or set CALIBRL_GPU_VENV"
export PATH="$VENV/bin:$PATH" # python, pip and ninja are the venv's from here on

# ------------------------------------------------------------------------------------------------ torch
torch_facts=$(python -c 'import torch; print(torch.__version__, torch.version.cuda or "none")') ||
    die "cannot import torch in $VENV: run scripts/cluster_env.sh build on the login node first"
read -r torch_version torch_cuda <<< "$torch_facts"
[ "$torch_cuda" != none ] || die "torch has no CUDA: $VENV has torch $torch_version, a CPU build (torch.version.cuda \
is None), and flash-attn compiles against torch's CUDA. Make the venv with PyPI's torch==2.13.0, the CUDA 13.0 build \
(scripts/cluster_env.sh build; not the CPU index https://download.pytorch.org/whl/cpu), or set CALIBRL_GPU_VENV"
names=$("$CLUSTER_ENV" wheel-name) || die "cannot name the wheel for torch $torch_version (above)"
label=$(sed -n 's/^build_label=//p' <<< "$names")
say "torch $torch_version (CUDA $torch_cuda): the wheel's local version is $label; cache $WHEELS"

install_and_check() {
    local wheel=$1
    python -m pip install --disable-pip-version-check --no-deps --force-reinstall "$wheel" ||
        die "pip cannot install $wheel into $VENV"
    python - <<'PY' || die "flash-attn does not work in $VENV (above)"
import torch
import flash_attn, flash_attn.bert_padding  # noqa: F401  (what OpenRLHF imports)
from flash_attn import flash_attn_func

print(f"flash_attn {flash_attn.__version__} imports (torch {torch.__version__})")
if torch.cuda.is_available():
    q, k, v = (torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    err = (out - ref.transpose(1, 2)).abs().max().item()
    print(f"flash_attn_func on {torch.cuda.get_device_name()}: max |difference| from torch's attention {err:.1e}")
    assert err < 5e-2, err
else:
    print("no GPU visible: import checked only")
PY
    say "$VENV has flash-attn from $wheel; now run scripts/cluster_env.sh build (or post) on the login node"
}

if cached=$("$CLUSTER_ENV" find-wheel); then
    say "the cache has $cached for this torch: installing it, nothing to build"
    install_and_check "$cached"
    exit 0
fi

# ------------------------------------------------------------------------------------------------ nvcc
cuda_major=${torch_cuda%%.*}
no_toolkit="load the CUDA $cuda_major toolkit (torch $torch_version is built with CUDA $torch_cuda): e.g. \
'module load cuda/$torch_cuda' ('module avail cuda' lists the site's), or set CUDA_HOME to it"
find_cuda_home() { # torch's order (torch.utils.cpp_extension): CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda
    local var dir nvcc
    for var in CUDA_HOME CUDA_PATH; do
        dir=${!var:-}
        [ -n "$dir" ] || continue
        [ -x "$dir/bin/nvcc" ] || die "no nvcc: $var=$dir has no bin/nvcc; $no_toolkit"
        echo "$dir"
        return
    done
    if nvcc=$(command -v nvcc); then # a module's bin/, or a link or wrapper to one
        for dir in "$(dirname "$(dirname "$nvcc")")" "$(dirname "$(dirname "$(readlink -f "$nvcc")")")"; do
            if [ -f "$dir/include/cuda_runtime.h" ]; then
                echo "$dir"
                return
            fi
        done
    fi
    [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda && return
    die "no nvcc: no CUDA_HOME, no nvcc on PATH${nvcc:+ with the toolkit beside it}, no /usr/local/cuda; $no_toolkit"
}
CUDA_HOME=$(find_cuda_home)
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
[ -f "$CUDA_HOME/include/cuda_runtime.h" ] || die "$CUDA_HOME has nvcc but not the CUDA headers (include/cuda_runtime.h); $no_toolkit"
nvcc_version=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
[ -n "$nvcc_version" ] || die "cannot read the version of $CUDA_HOME/bin/nvcc (nvcc --version)"
[ "${nvcc_version%%.*}" = "$cuda_major" ] || die "nvcc $nvcc_version ($CUDA_HOME) is not CUDA $cuda_major: torch \
refuses to compile an extension with a CUDA major other than its own ($torch_cuda); $no_toolkit"
[ "$nvcc_version" = "$torch_cuda" ] ||
    say "note: nvcc $nvcc_version, torch's CUDA $torch_cuda: same major, so torch only warns"
command -v "${CXX:-g++}" > /dev/null || die "no C++ compiler (${CXX:-g++}) on PATH, which nvcc needs: load the site's GCC module"
say "nvcc $nvcc_version at $CUDA_HOME, host compiler $(command -v "${CXX:-g++}")"

# ------------------------------------------------------------------------------------------------ build requirements
missing=()
ninja --version > /dev/null 2>&1 || missing+=(ninja) # torch runs the program; pip's ninja puts it in the venv
for module in packaging psutil einops setuptools wheel; do
    python -c "import $module" 2> /dev/null || missing+=("$module")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing the build requirements ${missing[*]} from $INDEX_URL"
    python -m pip install --disable-pip-version-check --timeout 20 --retries 1 --index-url "$INDEX_URL" "${missing[@]}" ||
        die "the build requirements ${missing[*]} are missing in $VENV and cannot be installed from this node; on \
the login node: $VENV/bin/python -m pip install ${missing[*]}"
fi

# ------------------------------------------------------------------------------------------------ sdist
mkdir -p "$WHEELS"
[ -e "$WHEELS/.gitignore" ] || echo '*' > "$WHEELS/.gitignore"
tmp=$(mktemp -d "$WHEELS/.build-XXXXXX") # in the cache's file system: the finished wheel is moved in at once
trap 'rm -rf "$tmp"' EXIT
# Built from the file, not by name: pip would discard a `flash-attn==2.8.3` whose metadata version carries the
# local version below ("inconsistent version").
sdist=
for file in "$WHEELS"/flash[-_]attn-"$FLASH_ATTN_VERSION".tar.gz; do [ -f "$file" ] && sdist=$file; done
if [ -z "$sdist" ]; then # cluster_env.sh post puts it there on the login node; else the index, from this node
    say "no flash-attn $FLASH_ATTN_VERSION sdist in $WHEELS: downloading it from $INDEX_URL"
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTN_LOCAL_VERSION='' python -m pip download --disable-pip-version-check \
        --quiet --timeout 20 --retries 1 --no-deps --no-build-isolation --no-binary :all: --index-url "$INDEX_URL" \
        -d "$tmp" "flash-attn==$FLASH_ATTN_VERSION" || die "cannot download flash-attn's sdist from $INDEX_URL on this \
node: run scripts/cluster_env.sh build (or post) on the login node, which puts it into $WHEELS, then submit again"
    for file in "$tmp"/flash[-_]attn-*.tar.gz; do [ -f "$file" ] && sdist=$file; done
    [ -n "$sdist" ] || die "pip download left no flash-attn sdist in $tmp"
fi

# ------------------------------------------------------------------------------------------------ resources
# GNU nproc would report an exported OMP_NUM_THREADS (often 1 on clusters) instead of the CPUs we have
cpus=${SLURM_CPUS_PER_TASK:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
mem_mb=${SLURM_MEM_PER_NODE:-0}
[ "$mem_mb" -gt 0 ] || [ -z "${SLURM_MEM_PER_CPU:-}" ] || mem_mb=$((SLURM_MEM_PER_CPU * cpus))
[ "$mem_mb" -gt 0 ] || mem_mb=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
jobs=$((mem_mb / 1024 / 9))
[ "$jobs" -le "$cpus" ] || jobs=$cpus
[ "$jobs" -ge 1 ] || { jobs=1; say "warning: ${mem_mb} MB of memory, under the ~9 GB one compile job can take"; }
export MAX_JOBS=${MAX_JOBS:-$jobs}
export NVCC_THREADS=${NVCC_THREADS:-2}
export FLASH_ATTN_CUDA_ARCHS=${FLASH_ATTN_CUDA_ARCHS:-90}
export FLASH_ATTENTION_FORCE_BUILD=TRUE  # no guess at a release wheel (GitHub; there is none for this torch)
export FLASH_ATTN_LOCAL_VERSION=$label   # names the wheel after the torch it is built for (the cache matches on it)
say "$cpus CPUs, $mem_mb MB: MAX_JOBS=$MAX_JOBS, NVCC_THREADS=$NVCC_THREADS, FLASH_ATTN_CUDA_ARCHS=$FLASH_ATTN_CUDA_ARCHS"

# ------------------------------------------------------------------------------------------------ build
say "compiling $sdist: 72 CUDA kernels, MAX_JOBS at a time (2-4.5 CPU-minutes and up to ~7 GB each, for one architecture)"
start=$SECONDS
python -m pip wheel --disable-pip-version-check --no-cache-dir --no-deps --no-build-isolation --no-index \
    -w "$tmp" "$sdist" ||
    die "the build failed after $(((SECONDS - start) / 60)) min (above; out of memory: fewer MAX_JOBS)"
built=
for file in "$tmp"/flash_attn-*.whl; do [ -f "$file" ] && built=$file; done
[ -n "$built" ] || die "pip wheel made no flash_attn wheel in $tmp"
mv "$built" "$WHEELS/"
say "built $(basename "$built") in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
wheel=$("$CLUSTER_ENV" find-wheel) || die "$(basename "$built") is not the wheel the cache expects for this torch ($label)"
install_and_check "$wheel"
