"""Killed training resumes exactly (issue 6): a CPU training job SIGTERMed or SIGKILLed at random moments, then
rerun, ends bit-identical to an uninterrupted run with the same seed: every checkpoint's policy and memory
weights, the optimizers, the RNG states, the data cursor and pool, and the metrics (which see the data order
and the sampling RNG).

Each chain runs one job (``python -c`` calling ``jobserver.run`` of ``calibrl.backends.jobs.train_job``, as the rule's
script does, in a fork of a job server as in ``make run``: an attempt does not pay ~8 s of imports) and kills it
several times before letting it finish; the uninterrupted reference runs are processes of their own, as on SLURM.
The kill moments are drawn from a seeded RNG:

* ``start``: a random delay after the job has claimed its run folder (grading workers, the filtering
  baseline's ranking, first steps);
* ``step``: a random number of completed checkpoints, then a random part of a training step;
* ``write``: the moment a chosen checkpoint's folder appears, i.e. in the middle of its write.

After every SIGKILL, half-written-looking temporaries (complete but wrong weights in a hidden ``.tmp`` policy
folder, a truncated trainer state, marker and metrics) are planted where a killed write leaves its own; the
rerun must not trust them, and removes them. Half the kills also remove the step markers and the metrics log,
which the job rebuilds from its checkpoints. The policy is warm-started so that rewards, hence
updates, are not all zero (an untrained policy never solves a Countdown problem and GRPO would never move its
weights).

The last test does the same through Snakemake: the snakemake process group SIGTERMed, the same command run
again and SIGKILLed, then ``--unlock`` and the same command to the end.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import SNAKEMAKE, copy_workflow, filled, load_config, snakemake, write_config
from safetensors.torch import load_file

from calibrl import backends, jobserver
from calibrl import grid as G
from calibrl.backends.local.warmstart import warmstart
from calibrl.checkpoints import settings_job
from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.models import build_model, build_tokenizer, save

pytestmark = pytest.mark.slow  # minutes: `make test-fast` leaves it out, `make test` runs it

STEPS = 10
# (method, signal, kills in the chain, seed of the kill moments): 4 x 4 + 4 x 3 = 28 kill points
CHAINS = [
    ("grpo", signal.SIGKILL, 3, 0),
    ("grpo", signal.SIGTERM, 3, 1),
    ("dapo_iac_dlc", signal.SIGKILL, 4, 2),
    ("dapo_iac_dlc", signal.SIGTERM, 4, 3),
    ("filter", signal.SIGKILL, 4, 4),
    ("filter", signal.SIGTERM, 4, 5),
    ("iac", signal.SIGKILL, 3, 6),
    ("dapo", signal.SIGTERM, 3, 7),
]
ARCH = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
MEMORY_ARCH = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 32}
WRITING = "during a checkpoint write"


def micro_grid() -> dict:
    grid = filled("config")["grid"]
    grid["models"] = {"qwen3-tiny-m": {**ARCH, "memory": "qwen3-tiny-xs"}}
    grid["memory_models"] = {"qwen3-tiny-xs": MEMORY_ARCH}
    # a checkpoint at every step: kills land before, during and after checkpoint writes
    grid["train"].update(steps=STEPS, eval_every=1, prompts_per_step=4, group_size=4, filter_samples=2)
    return grid


# ------------------------------------------------------------------------------------------ run folders
def complete(run_dir: Path) -> list[int]:
    """Steps whose checkpoint is complete (its trainer state is written last, atomically)."""
    return sorted(int(p.parent.name[5:]) for p in (run_dir / "ckpt").glob("step_*/trainer_state.pt"))


def started(run_dir: Path) -> dict[int, float]:
    """Checkpoint folders (complete or not) -> their modification time."""
    return {int(p.name[5:]): p.stat().st_mtime for p in (run_dir / "ckpt").glob("step_*") if p.is_dir()}


def markers(run_dir: Path) -> list[Path]:
    return list((run_dir / "ckpt").glob("step_*.done"))


def marker_steps(run_dir: Path) -> list[int]:
    return sorted(json.loads(m.read_text())["step"] for m in markers(run_dir))


def weights(run_dir: Path, step: int) -> dict:
    folder = run_dir / "ckpt" / f"step_{step}"
    state = {f"policy.{k}": v for k, v in load_file(folder / "policy" / "model.safetensors").items()}
    if (folder / "memory").exists():
        state.update({f"memory.{k}": v for k, v in load_file(folder / "memory" / "model.safetensors").items()})
    return state


def trainer_state(run_dir: Path, step: int) -> dict:
    state = torch.load(run_dir / "ckpt" / f"step_{step}" / "trainer_state.pt", weights_only=False)
    state["history"] = [{k: v for k, v in row.items() if k not in ("seconds", "time")} for row in state["history"]]
    return state


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("seconds", "time")} for row in rows]  # wall time differs


def assert_same(a, b, where: str = "") -> None:
    """Nested dicts/lists of tensors and plain values, tensors compared with torch.equal (dtype included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_run(run: Path, reference: Path, steps: list[int], what: str) -> None:
    """Every checkpoint's weights, the last trainer state (optimizers, RNG, cursor, pool, history), metrics."""
    for step in steps:
        assert_same(weights(run, step), weights(reference, step), f"{what} step {step}")
    assert_same(trainer_state(run, steps[-1]), trainer_state(reference, steps[-1]), f"{what} trainer state")
    assert metrics(run) == metrics(reference), f"{what}: metrics differ"


# ------------------------------------------------------------------------------------------ CPU trainer
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A warm-started policy and a fresh memory (tiny Qwen3s), training data, and the uninterrupted runs."""
    root = tmp_path_factory.mktemp("resume")
    records = countdown.generate("train", 48, seed=0)
    train = root / "train.jsonl"
    write_jsonl(train, records)
    warmstart(records, ARCH, 300, 32, 1e-2, 0.01, 0, micro_grid()["prompt_template"], root / "policy")
    tok = build_tokenizer()
    save(build_model(tok, seed=1, **MEMORY_ARCH), tok, root / "memory")
    infos = {}
    for name in ("policy", "memory"):
        infos[name] = root / f"{name}-info.json"
        infos[name].write_text(json.dumps({"path": str(root / name)}))
    grid = micro_grid()
    methods = sorted({method for method, *_ in CHAINS})
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda m: attempt(job(grid, m, root / "reference" / m, train, infos)), methods))
    assert all(rc == 0 for rc, _ in done), [err[-3000:] for _, err in done]
    for method in methods:  # the comparison means something only if training moves the weights
        ref = root / "reference" / method
        first, last = weights(ref, 1), weights(ref, STEPS)
        for part in ("policy", "memory") if grid["methods"][method].get("dlc_mu") else ("policy",):
            assert any(not torch.equal(first[k], last[k]) for k in first if k.startswith(part)), (method, part)
    return root, grid, train, infos


def job(grid: dict, method: str, run_dir: Path, train: Path, infos: dict) -> list[str]:
    """The train job's command, after the run's settings.json is made as rule run_settings makes it: in a fork of
    the job server where ``CALIBRL_JOBSERVER`` names one (``attempt``'s ``env``), else in its own process."""
    inputs = {"train": str(train), "init": str(infos["policy"])}
    if grid["methods"][method].get("dlc_mu"):
        inputs["memory"] = str(infos["memory"])
    settings = run_dir / "settings.json"
    if not settings.exists():
        params = G.train_params({"grid": grid}, G.Run("qwen3-tiny-m", method, 0))
        settings_job(params, None, str(settings), inputs)
    args = {
        "settings_path": str(settings),
        "stop_at": STEPS,
        "marker": str(run_dir / "ckpt" / f"segment_{STEPS}.done"),
    }
    code = (  # grading workers re-import __main__: the job runs under the guard, as the rule scripts do
        "import json, sys\n"
        "from calibrl import jobserver\n"
        "if __name__ == '__main__':\n"
        "    jobserver.run('calibrl.backends.jobs:train_job', None, **json.loads(sys.argv[1]))\n"
    )
    return [sys.executable, "-c", code, json.dumps(args)]


def attempt(cmd: list[str], wait=None, sig=signal.SIGKILL, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` in its own process group; ``wait(proc)`` returns once it is time to send ``sig`` to the group
    (the grading workers with the trainer, as a scheduler or a dying node does; in a job server's fork, the script
    forwards SIGTERM and its death kills the fork's group). Returns when every holder of the job's stderr, the fork
    and its workers included, has exited."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
    )
    if wait is not None:
        try:
            wait(proc)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def poll(proc, until, every: float, limit: float = 240.0) -> None:
    deadline = time.monotonic() + limit
    while not until() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(every)


def kill_moment(rng: random.Random, run_dir: Path, first: bool):
    """A seeded kill moment for the next attempt: (kind, wait function), or None when no room is left."""
    done = max(complete(run_dir), default=0)
    kinds = ["start", "step", "write"] if first else ["step", "step", "write"]
    kind = rng.choice(kinds)
    if kind == "step" and done + 1 > STEPS - 2:
        kind = "write"
    if kind == "start":  # event: the job has claimed its run folder (calibrl.checkpoints.claim)
        delay = rng.uniform(0.0, 0.25)  # within its start: unloaded, a chain's job trains all 10 steps in ~0.6 s

        def wait(proc):
            poll(proc, lambda: (run_dir / "ckpt" / "fingerprint.json").exists(), 0.005)
            time.sleep(delay)

        return kind, wait
    if kind == "step":
        target, extra = rng.randint(done + 1, min(done + 2, STEPS - 2)), rng.uniform(0.0, 0.04)

        def wait(proc):
            poll(proc, lambda: max(complete(run_dir), default=0) >= target, 0.005)
            time.sleep(extra)  # into the next step, or into the next checkpoint write

        return kind, wait
    highest = max(started(run_dir), default=0)  # a checkpoint folder no attempt has made yet
    if highest + 1 > STEPS:
        return None
    step, extra = rng.randint(highest + 1, min(highest + 2, STEPS)), rng.uniform(0.0, 0.006)

    def wait(proc):
        poll(proc, lambda: (run_dir / "ckpt" / f"step_{step}").is_dir(), 0.001)
        time.sleep(extra)

    return kind, wait


def landing(run_dir: Path, before: dict[int, float]) -> str:
    """Where the kill landed, seen from the run folder (``before``: its checkpoint folders before the attempt)."""
    done = max(complete(run_dir), default=0)
    if any(step > done and before.get(step) != mtime for step, mtime in started(run_dir).items()):
        return WRITING
    return "before the first checkpoint" if done == 0 else "between checkpoints"


def plant_half_written(run_dir: Path, init_policy: Path) -> None:
    """Temporaries as a killed write leaves them, next to the checkpoint the rerun will write next; a complete
    loadable policy with wrong weights among them: trusting any of them changes the result or fails."""
    step = max(started(run_dir), default=0) + 1
    folder = run_dir / "ckpt" / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(init_policy, folder / ".policy.planted.tmp")
    (folder / ".trainer_state.pt.planted.tmp").write_bytes(b"PK\x03\x04 half a zip")
    (run_dir / "ckpt" / f".step_{step}.done.planted.tmp").write_text('{"step": ')
    (run_dir / "ckpt" / ".metrics.jsonl.planted.tmp").write_text('{"step": 1, "reward": 1.0, "los')


def run_chain(setup, env: dict, method: str, sig: signal.Signals, kills: int, seed: int, out: Path) -> list[tuple]:
    """Kill one job up to ``kills`` times at seeded moments, then let it finish (``env``: the job server's).

    Returns one (kind of moment, landing, complete checkpoints) per kill that stopped a running job."""
    root, grid, train, infos = setup
    rng = random.Random(seed)
    cmd = job(grid, method, out, train, infos)
    points = []
    for i in range(kills):
        moment = kill_moment(rng, out, first=i == 0)
        if moment is None:
            break
        kind, wait = moment
        before = started(out)
        rc, err = attempt(cmd, wait, sig, env)
        if rc == 0:  # it finished before the moment came: nothing left to interrupt
            break
        assert rc == -sig, f"attempt failed (rc {rc}) instead of being stopped by {sig.name}:\n{err[-3000:]}"
        points.append((kind, landing(out, before), max(complete(out), default=0)))
        if sig == signal.SIGKILL:
            plant_half_written(out, root / "policy")
        if rng.random() < 0.5:  # markers and the step log lost: the job rebuilds them from its checkpoints
            for marker in markers(out):
                marker.unlink()
            (out / "ckpt" / "metrics.jsonl").unlink(missing_ok=True)
    rc, err = attempt(cmd, env=env)
    assert rc == 0, err[-3000:]
    return points


@pytest.fixture(scope="module")
def server():
    """A job server as the Snakefile starts one for local runs; its address only in the chains' environment (not
    this process's, whose other tests' jobs must run on their own)."""
    path = jobserver.start(backends.get("local").preload)
    assert path, "the job server did not start"
    env = {**os.environ}
    os.environ.pop(jobserver.ENV)
    yield env
    os.environ[jobserver.ENV] = path
    jobserver.stop()


@pytest.fixture(scope="module")
def chains(setup, server, tmp_path_factory):
    """Every chain, two at a time, in forks of the job server; chain i -> (its run folder, its kill points)."""
    root = tmp_path_factory.mktemp("chains")

    def one(i):
        return root / str(i), run_chain(setup, server, *CHAINS[i], root / str(i))

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(len(CHAINS))))


@pytest.mark.parametrize("i", range(len(CHAINS)), ids=[f"{c[0]}-{c[1].name}-{c[3]}" for c in CHAINS])
def test_killed_training_resumes_bit_identical(setup, chains, i):
    root = setup[0]
    method, sig, kills, _ = CHAINS[i]
    run, points = chains[i]
    reference = root / "reference" / method
    assert len(points) >= kills - 1, points  # kill points that stopped a running job
    assert complete(run) == list(range(1, STEPS + 1))
    assert_same_run(run, reference, complete(run), method)
    # the markers Snakemake tracks: one per checkpoint, pointing at this run's own weights
    assert marker_steps(run) == complete(run)
    for marker in markers(run):
        content = json.loads(marker.read_text())
        assert Path(content["policy"]) == (run / "ckpt" / f"step_{content['step']}" / "policy").resolve()
    if (reference / "filter.json").exists():
        assert json.loads((run / "filter.json").read_text()) == json.loads((reference / "filter.json").read_text())
    # Temporaries of killed writes (the planted ones included) are removed when the job starts again.
    assert not [p for p in run.rglob(".*") if p.name.endswith((".tmp", ".old"))]


def test_kill_points_cover_signals_methods_and_writes(chains):
    points = [(CHAINS[i][1].name, CHAINS[i][0], *p) for i, (_, pts) in enumerate(chains) for p in pts]
    counts = sorted(Counter(p[:4] for p in points).items())
    table = "\n".join(f"{n:3d}  {sig} {method} {kind}: {where}" for (sig, method, kind, where), n in counts)
    print(f"\n{len(points)} kill points:\n{table}")
    assert len(points) >= 20, table
    by_signal = Counter(p[0] for p in points)
    assert by_signal["SIGKILL"] >= 8 and by_signal["SIGTERM"] >= 8, table
    assert {"dapo_iac_dlc", "filter"} <= {p[1] for p in points}, table
    assert any(p[3] == WRITING for p in points), f"no kill landed during a checkpoint write:\n{table}"


# ------------------------------------------------------------------------------------------ Snakemake
def snakemake_group(work: Path, log: Path, *args: str) -> subprocess.Popen:
    with open(log, "w") as fh:
        return subprocess.Popen(
            [*SNAKEMAKE, "--cores", "1", *args], cwd=work, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )


def stamps(run_dir: Path) -> dict[int, tuple]:
    """Complete checkpoints -> identity and time of every file in them: unchanged when not retrained."""
    out = {}
    for step in complete(run_dir):
        files = sorted(p for p in (run_dir / "ckpt" / f"step_{step}").rglob("*") if p.is_file())
        out[step] = tuple((str(p), p.stat().st_ino, p.stat().st_mtime_ns) for p in files)
    return out


@pytest.mark.slow
def test_snakemake_killed_mid_training_then_rerun(tmp_path):
    """The user's view: `snakemake --cores 1` SIGTERMed (Ctrl-C-like, a scheduler's time limit) while `train`
    runs; the same command again (with --rerun-incomplete), SIGKILLed (a dying node); `snakemake --unlock` and
    the same command to the end. Each rerun resumes from the last complete checkpoint, leaves the finished
    checkpoints untouched, and the run ends as an uninterrupted one does."""
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
    grid["data"]["splits"] = {"sft": 48, "train": 16, "test": 4, "ood": 2}
    grid["warmstart"].update(steps=200, batch_size=32)
    write_config(work / "config" / "config.yaml", cfg)
    target = "results/runs/qwen3-tiny-m/dapo_iac_dlc/s0/metrics.jsonl"
    d = grid["data"]["seed"]  # seed 0's data seed (the plan's arms run other seeds)
    snakemake(
        work,
        "--cores",
        "1",
        f"results/models/qwen3-tiny-xs/d{d}/init.json",
        f"results/models/qwen3-tiny-m/d{d}/init.json",
    )
    reference = tmp_path / "reference"
    shutil.copytree(work, reference, symlinks=True)  # same warm starts (their info files point into `work`)
    ref = snakemake_group(reference, tmp_path / "reference.out", target)  # side by side with the killed one

    run_dir = work / "results" / "runs" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0"
    logs = work / "results" / "logs" / "train" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0"

    def resumed_after(step: int) -> str:
        """The log of the segment after checkpoint ``step`` (one training job per checkpoint), which resumes it."""
        return (logs / f"segment_{step + 2}.log").read_text()

    def killed(sig: signal.Signals, more: int, *args: str) -> None:
        """Run the target, send ``sig`` to snakemake's process group once ``more`` checkpoints are added."""
        before, out = len(complete(run_dir)), tmp_path / f"{sig.name}.out"
        proc = snakemake_group(work, out, *args, target)
        poll(proc, lambda: len(complete(run_dir)) >= before + more, 0.01)
        assert proc.poll() is None, f"snakemake ended before it could be killed:\n{out.read_text()[-3000:]}"
        os.killpg(proc.pid, sig)
        proc.wait(timeout=120)
        assert complete(run_dir)[-1] < 12, "training finished before the kill"

    killed(signal.SIGTERM, 2)
    first, kept = complete(run_dir)[-1], stamps(run_dir)
    killed(signal.SIGKILL, 2, "--rerun-incomplete")  # the same command again (as Snakemake's message asks)
    assert f"resumed from checkpoint step {first}" in resumed_after(first), resumed_after(first)[-2000:]
    assert stamps(run_dir).items() >= kept.items(), "a finished checkpoint was written again"
    second, kept = complete(run_dir)[-1], stamps(run_dir)
    assert second >= first + 4
    snakemake(work, "--unlock", target)  # a SIGKILLed snakemake leaves its lock behind
    snakemake(work, "--cores", "1", "--rerun-incomplete", target)
    assert f"resumed from checkpoint step {second}" in resumed_after(second), resumed_after(second)[-2000:]
    assert stamps(run_dir).items() >= kept.items(), "a finished checkpoint was written again"
    assert complete(run_dir) == marker_steps(run_dir) == [2, 4, 6, 8, 10, 12]

    assert ref.wait(timeout=300) == 0, (tmp_path / "reference.out").read_text()[-3000:]
    ref_dir = reference / "results" / "runs" / "qwen3-tiny-m" / "dapo_iac_dlc" / "s0"
    assert_same_run(run_dir, ref_dir, [2, 4, 6, 8, 10, 12], "snakemake")
