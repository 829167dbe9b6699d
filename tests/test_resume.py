"""Killed training resumes exactly: a CPU training job SIGTERMed or SIGKILLed at random moments (between and
during steps, checkpoint writes and the filtering ranking), then rerun, ends bit-identical to an uninterrupted
run with the same seed: policy and memory weights, optimizer, RNG and data order (seen through the metrics).

Each chain kills one job several times before letting it finish; chains run two at a time (two cores).
A last test does the same through Snakemake itself: the snakemake process group killed mid-training, the
same command run again.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import REPO, SNAKEMAKE, copy_workflow, load_config, write_config
from safetensors.torch import load_file

from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.models import build_model, build_tokenizer, save

STEPS = 8
# (method, signal, kills in the chain, seed of the kill moments); 8 chains x 3 kills = 24 kill points
CHAINS = [
    ("grpo", signal.SIGKILL, 3, 0),
    ("grpo", signal.SIGTERM, 3, 1),
    ("dapo_iac_dlc", signal.SIGKILL, 3, 2),
    ("dapo_iac_dlc", signal.SIGTERM, 3, 3),
    ("filter", signal.SIGKILL, 3, 4),
    ("filter", signal.SIGTERM, 3, 5),
    ("iac", signal.SIGKILL, 3, 6),
    ("dapo", signal.SIGTERM, 3, 7),
]
ARCH = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
MEMORY_ARCH = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}


def micro_grid() -> dict:
    grid = load_config(REPO)["grid"]
    grid["models"] = {"qwen3-tiny-m": {**ARCH, "memory": "qwen3-tiny-xs"}}
    grid["memory_models"] = {"qwen3-tiny-xs": MEMORY_ARCH}
    # a checkpoint at every step: kills land before, during and after checkpoint writes
    grid["train"].update(steps=STEPS, eval_every=1, prompts_per_step=4, group_size=4, filter_samples=2)
    return grid


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Initial policy and memory (tiny Qwen3s), training data, and the uninterrupted reference runs."""
    root = tmp_path_factory.mktemp("resume")
    tok = build_tokenizer()
    infos = {}
    for name, arch, seed in (("policy", ARCH, 0), ("memory", MEMORY_ARCH, 1)):
        save(build_model(tok, seed=seed, **arch), tok, root / name)
        infos[name] = root / f"{name}.json"
        infos[name].write_text(json.dumps({"path": str(root / name)}))
    train = root / "train.jsonl"
    write_jsonl(train, countdown.generate("train", 48, seed=0))
    grid = micro_grid()
    methods = sorted({method for method, *_ in CHAINS})
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda m: attempt(job(grid, m, root / "reference" / m, train, infos)), methods))
    assert all(rc == 0 for rc, _ in done), [err for _, err in done]
    return root, grid, train, infos


def job(grid: dict, method: str, run_dir: Path, train: Path, infos: dict) -> list[str]:
    args = {
        "grid": grid,
        "model": "qwen3-tiny-m",
        "method": method,
        "seed": 0,
        "train_path": str(train),
        "init_info": str(infos["policy"]),
        "run_dir": str(run_dir),
        "memory_info": str(infos["memory"]) if grid["methods"][method].get("dlc_mu") else None,
    }
    code = (  # grading workers re-import __main__: the job runs under the guard, as the rule scripts do
        "import json, sys\n"
        "from calibrl.logs import setup\n"
        "from calibrl.pipeline import train_job\n"
        "if __name__ == '__main__':\n"
        "    setup()\n"
        "    train_job(**json.loads(sys.argv[1]))\n"
    )
    return [sys.executable, "-c", code, json.dumps(args)]


def attempt(cmd: list[str], kill_after=None, sig=signal.SIGKILL) -> tuple[int, str]:
    """Run ``cmd`` in its own process group; ``kill_after(proc)`` returns once it is time to send ``sig``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    if kill_after is not None:
        kill_after(proc)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def checkpoints(run_dir: Path) -> int:
    return len(list((run_dir / "ckpt").glob("step_*.done")))


def final_state(run_dir: Path) -> dict:
    step = run_dir / "ckpt" / f"step_{STEPS}"
    state = {f"policy.{k}": v for k, v in load_file(step / "policy" / "model.safetensors").items()}
    if (step / "memory").exists():
        state.update({f"memory.{k}": v for k, v in load_file(step / "memory" / "model.safetensors").items()})
    return state


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # wall time differs, nothing else


def run_chain(setup, method: str, sig: signal.Signals, kills: int, seed: int, out: Path) -> list[int]:
    """Kill one job ``kills`` times at random moments, then let it finish; returns the steps reached at
    each effective kill."""
    root, grid, train, infos = setup
    rng = random.Random(seed)
    cmd = job(grid, method, out, train, infos)
    reached = []
    for _ in range(kills):
        now = checkpoints(out)
        target = rng.randint(min(now, STEPS - 3), max(min(now + 2, STEPS - 3), min(now, STEPS - 3)))
        extra = rng.uniform(0.0, 0.15)

        def kill_after(proc, target=target, extra=extra):
            deadline = time.monotonic() + 240
            while checkpoints(out) < target and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(extra)  # into the next step, or the middle of its checkpoint write

        rc, err = attempt(cmd, kill_after, sig)
        if rc == 0:  # it finished within `extra`: no kill point, and nothing left to interrupt
            break
        assert rc == -sig, f"attempt failed (rc {rc}) instead of being stopped by {sig.name}:\n{err[-3000:]}"
        reached.append(checkpoints(out))
        if rng.random() < 0.5:  # as Snakemake does after a failed job: its declared outputs are removed
            for marker in (out / "ckpt").glob("step_*.done"):
                marker.unlink()
            (out / "metrics.jsonl").unlink(missing_ok=True)
    rc, err = attempt(cmd)
    assert rc == 0, err[-3000:]
    return reached


@pytest.fixture(scope="module")
def chains(setup, tmp_path_factory):
    """Every chain, two at a time; chain i -> (its run folder, the checkpoints reached at each kill)."""
    root = tmp_path_factory.mktemp("chains")

    def one(i):
        return root / str(i), run_chain(setup, *CHAINS[i], root / str(i))

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(len(CHAINS))))


@pytest.mark.parametrize("i", range(len(CHAINS)), ids=[f"{c[0]}-{c[1].name}" for c in CHAINS])
def test_killed_training_resumes_bit_identical(setup, chains, i):
    root = setup[0]
    method, _, kills, _ = CHAINS[i]
    run, reached = chains[i]
    assert len(reached) >= kills - 1, reached  # kill points that stopped a running job
    reference, resumed = final_state(root / "reference" / method), final_state(run)
    assert reference.keys() == resumed.keys()
    for name in reference:
        assert torch.equal(reference[name], resumed[name]), f"{method}: {name} differs after resuming"
    assert metrics(run) == metrics(root / "reference" / method)
    assert checkpoints(run) == STEPS
    for p in run.rglob("*.tmp"):  # temporaries of killed writes: hidden names no rule declares
        assert p.name.startswith("."), p


def test_enough_kill_points(chains):
    assert sum(len(reached) for _, reached in chains) >= 20


# ------------------------------------------------------------------------------------------ Snakemake
@pytest.mark.slow
def test_snakemake_killed_mid_training_then_rerun(tmp_path):
    """The user's view: `snakemake --cores 1` killed (SIGKILL to its process group, as when a node dies) while
    `train` runs, then `snakemake --unlock` and the same command again with --rerun-incomplete (what
    Snakemake's messages ask for); the run resumes from its last checkpoint and ends as an uninterrupted
    run does."""
    (tmp_path / "killed").mkdir()
    work = copy_workflow(tmp_path / "killed")
    cfg = load_config(work)
    grid = cfg["grid"]
    grid.update(
        {k: v for k, v in micro_grid().items() if k in ("models", "memory_models", "train")},
        main_model="qwen3-tiny-m",
        extra_seeds={},
    )
    grid["train"].update(steps=12, eval_every=2)
    grid["data"]["splits"] = {"train": 48, "test": 4, "ood": 2}
    grid["warmstart"].update(steps=10, batch_size=8)
    write_config(work / "config" / "config.yaml", cfg)
    target = "results/runs/qwen3-tiny-m/dapo_iac_dlc/s0/metrics.jsonl"
    inits = ["results/models/qwen3-tiny-xs/init.json", "results/models/qwen3-tiny-m/init.json"]
    warm = subprocess.run([*SNAKEMAKE, "--cores", "1", *inits], cwd=work, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr[-3000:]
    reference = tmp_path / "reference"
    shutil.copytree(work, reference, symlinks=True)  # same warm starts (their info files point into `work`)

    run_dir = work / "results" / "runs" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0"
    proc = subprocess.Popen(
        [*SNAKEMAKE, "--cores", "1", target], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while checkpoints(run_dir) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "training finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # what Snakemake asks for after a kill: release its lock, then run the same target again
    unlock = subprocess.run([*SNAKEMAKE, "--unlock", target], cwd=work, capture_output=True, text=True)
    assert unlock.returncode == 0, unlock.stderr[-3000:]
    again = subprocess.run([*SNAKEMAKE, "--cores", "1", "--rerun-incomplete", target], cwd=work,
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0, again.stderr[-4000:]
    log = (work / "results" / "logs" / "train" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0.log").read_text()
    assert "resumed from checkpoint step" in log, log[-2000:]
    resumed_from = int(log.split("resumed from checkpoint step ")[1].split()[0])
    assert 6 <= resumed_from < 12

    ref = subprocess.run([*SNAKEMAKE, "--cores", "1", target], cwd=reference, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_dir = reference / "results" / "runs" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0"
    for part in ("policy", "memory"):
        a = load_file(run_dir / "ckpt" / "step_12" / part / "model.safetensors")
        b = load_file(ref_dir / "ckpt" / "step_12" / part / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    assert metrics(run_dir) == metrics(ref_dir)
