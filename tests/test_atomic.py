"""Nothing half-written is trusted: an evaluation or an aggregation killed (SIGKILL) at a chosen moment leaves
each of its output files either complete (byte-identical to an uninterrupted run) or absent, and a rerun
gives exactly the uninterrupted result. Only hidden ``.<name>.*.tmp`` files may be left, which no rule
declares.

Kill moments are events, not delays, so every test exercises what it claims however loaded the machine is:
the k-th output file appearing (complete files are left behind), a hidden temporary appearing (a write is
under way), or the job having started (nothing is left yet)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fake_run_results, filled

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.models import build_model, build_tokenizer, save

pytestmark = pytest.mark.slow  # minutes: `make test-fast` leaves it out, `make test` runs it

KILLS_PER_JOB = 5
RUNS = [("qwen3-tiny-m", "grpo", 0), ("qwen3-tiny-m", "iac", 0), ("qwen3-tiny-m", "grpo", 1)]


def grid_config() -> dict:
    grid = filled("config")["grid"]
    grid["models"] = {"qwen3-tiny-m": grid["models"]["qwen3-tiny-m"]}
    grid["seed"] = 0  # the fake runs' main seed
    grid["tables"] = {"table2_3": ["grpo", "iac"], "table4": ["iac"], "table5": ["grpo", "iac"], "figure6": ["grpo"]}
    grid["eval"].update(n=4, k=4, max_new_tokens=6)
    return grid


JOBS = {"evaluate": "calibrl.evaluate", "aggregate": "calibrl.report.jobs"}


def job_script(kind: str, args: dict) -> list[str]:
    """A subprocess running one job as its rule does (grading workers need a real __main__ module)."""
    code = (
        "import json, sys\n"
        f"from {JOBS[kind]} import {kind}_job\n"
        "if __name__ == '__main__':\n"
        f"    {kind}_job(**json.loads(sys.argv[1]))\n"
    )
    return [sys.executable, "-c", code, json.dumps(args)]


def files(root: Path) -> dict[str, bytes]:
    """Every output file under ``root`` (not the inputs under ``runs/``), except the hidden temporaries of
    calibrl.io.atomic_path (the folder's own path, which some outputs name, replaced so that two folders
    compare)."""
    prefix = str(root).encode()
    return {
        str(p.relative_to(root)): p.read_bytes().replace(prefix, b"<root>")
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and p.relative_to(root).parts[0] != "runs"
        and not (p.name.startswith(".") and p.name.endswith(".tmp"))
    }


def clear_outputs(root: Path) -> None:
    """What Snakemake does before running a job: its outputs go (here: everything but the inputs, runs/)."""
    for p in root.iterdir() if root.exists() else []:
        if p.name != "runs":
            shutil.rmtree(p) if p.is_dir() else p.unlink()


def written(out: Path) -> int:
    return len(files(out)) if out.exists() else 0


def writing(out: Path) -> bool:
    return out.exists() and any(p.name.startswith(".") and p.name.endswith(".tmp") for p in out.rglob("*"))


def moments(total: int, rng: random.Random) -> list[tuple[str, object]]:
    """KILLS_PER_JOB kill events for a job that writes ``total`` files: after the k-th file (random k), during a
    write, and once at start-up; each is a predicate on the output folder."""
    events = [("start", lambda out: True), ("mid-write", writing)]
    while len(events) < KILLS_PER_JOB:
        k = rng.randint(1, total - 1)
        events.append((f"after file {k}", lambda out, k=k: written(out) >= k))
    rng.shuffle(events)
    return events


def kill_and_rerun(cmd: list[str], out: Path, reference: dict[str, bytes], event, rerun: bool) -> int | None:
    """SIGKILL ``cmd`` once ``event(out)`` holds, check what it left; then (``rerun``) rerun it, check the result.
    Returns how many complete files were left, or None when the job finished before the event."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    while not event(out) and proc.poll() is None:
        time.sleep(0.002)
    finished = proc.poll() is not None
    if not finished:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    left = files(out)
    for name, data in left.items():
        assert name in reference, f"{name}: a file the uninterrupted run does not write"
        assert data == reference[name], f"{name}: half-written after SIGKILL"
    if rerun:
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert files(out) == reference
    return None if finished else len(left)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("atomic")
    tok = build_tokenizer()
    save(build_model(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
         tok, root / "policy")  # fmt: skip
    splits = {}
    for name, n in (("test", 24), ("ood", 8)):
        splits[name] = str(root / f"{name}.jsonl")
        write_jsonl(splits[name], countdown.generate(name, n, seed=1))
    settings = root / "settings.json"
    stamp = checkpoints.stamp({"run": "qwen3-tiny-m/grpo/s0", "seed": 0}, {})
    settings.write_text(json.dumps(stamp))
    markers = []
    for step in (2, 4, 6):
        marker = root / f"step_{step}.done"
        content = {"step": step, "policy": str(root / "policy"), "fingerprint": stamp["fingerprint"]}
        marker.write_text(json.dumps(content))
        markers.append(str(marker))
    return root, settings, markers, splits


def test_interrupted_evaluation_leaves_complete_files_or_none(checkpoint, tmp_path):
    root, settings, markers, splits = checkpoint
    grid = grid_config()
    params = G.eval_params({"grid": grid})

    def args(out: Path) -> dict:
        outs = [str(out / f"step_{s}.json") for s in (2, 4, 6)]
        steps = [2, 4, 6]
        return dict(params=params, settings_path=str(settings), markers=markers, split_paths=splits, out_paths=outs,
                    steps=steps)  # fmt: skip

    ref_dir = tmp_path / "reference"
    subprocess.run(job_script("evaluate", args(ref_dir)), check=True, capture_output=True)
    reference = files(ref_dir)
    assert sorted(reference) == ["step_2.json", "step_4.json", "step_6.json"]

    out = tmp_path / "killed"
    left = {}
    for i, (name, event) in enumerate(moments(len(reference), random.Random(0))):
        shutil.rmtree(out, ignore_errors=True)  # Snakemake removes a job's outputs before running it
        cmd = job_script("evaluate", args(out))
        left[name] = kill_and_rerun(cmd, out, reference, event, rerun=i == KILLS_PER_JOB - 1)
    after = [n for k, n in left.items() if k.startswith("after file")]
    assert after and all(n is not None and n >= 1 for n in after), left  # complete files were there to check


def aggregate_args(res: Path) -> dict:
    """Arguments of ``calibrl.report.jobs.aggregate_job`` over fake results under ``res/runs`` (made on first
    use); its outputs go beside them, under ``res``."""
    grid = grid_config()
    grid["data"]["eval_splits"] = ["test"]
    if not (res / "runs").exists():
        fake_run_results(res, RUNS, k=4)
    evals = sorted(str(p) for p in (res / "runs").rglob("eval/step_*.json"))
    metrics = sorted(str(p) for p in (res / "runs").rglob("metrics.jsonl"))
    return dict(grid=grid, eval_paths=evals, metric_paths=metrics, root=str(res), done_path=str(res / "aggregate.json"))


def test_interrupted_aggregation_leaves_complete_files_or_none(tmp_path):
    args = aggregate_args

    ref = tmp_path / "reference"
    subprocess.run(job_script("aggregate", args(ref)), check=True, capture_output=True)
    reference = files(ref)
    assert "aggregate.json" in reference and "summary.md" in reference

    res = tmp_path / "killed"
    left = {}
    for i, (name, event) in enumerate(moments(len(reference), random.Random(1))):
        clear_outputs(res)
        cmd = job_script("aggregate", args(res))
        left[name] = kill_and_rerun(cmd, res, reference, event, rerun=i == KILLS_PER_JOB - 1)
    after = [n for k, n in left.items() if k.startswith("after file")]
    assert after and all(n is not None and n >= 1 for n in after), left


def test_remove_temporaries_takes_only_what_killed_writes_leave(tmp_path):
    from calibrl.io import atomic_path, remove_temporaries

    step = tmp_path / "ckpt" / "step_2"
    (step / ".policy.abc123.tmp" / "sub").mkdir(parents=True)  # models.save's folder, killed mid-write
    (step / ".policy.abc123.tmp" / "sub" / ".x.tmp").write_text("inside a removed folder")
    (step / ".policy.def456.old" / "policy").mkdir(parents=True)  # its moved-aside previous checkpoint
    (step / ".trainer_state.pt.q1w2.tmp").write_bytes(b"PK half")  # atomic_path's file
    keep = [step / "policy" / "model.safetensors", step / "trainer_state.pt", tmp_path / ".hidden", tmp_path / "a.tmp"]
    for p in keep:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("complete")
    assert remove_temporaries(tmp_path) == 3
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(keep)
    assert remove_temporaries(tmp_path) == 0
    with atomic_path(tmp_path / "out.txt") as tmp:  # what atomic_path leaves on a kill is what it matches
        assert tmp.name.startswith(".out.txt.") and tmp.name.endswith(".tmp")


def test_aggregation_lists_no_temporary_left_by_a_killed_run(tmp_path):
    """A killed aggregation can leave a hidden temporary among the tables; the rerun's aggregate.json lists the
    tables, and must not list it (found by the kill test above when a kill landed mid-write)."""
    args = aggregate_args(tmp_path)
    tables = Path(args["root"]) / "tables"
    tables.mkdir(parents=True)
    (tables / ".table5_vs_paper.md.x1y2.tmp").write_text("half a table")
    subprocess.run(job_script("aggregate", args), check=True, capture_output=True)
    listed = json.loads(Path(args["done_path"]).read_text())["tables"]
    assert listed == sorted(str(p) for p in tables.iterdir() if not p.name.startswith("."))
    assert "table5_vs_paper.md" in {Path(p).name for p in listed}


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_results_are_as_readable_as_the_umask_allows(tmp_path, mask):
    """tempfile makes 0600 files and 0700 folders whatever the umask: what atomic_path and models.save leave
    has the mode a plain open or mkdir would (a collaborator in the group reads them under umask 027)."""
    from calibrl.io import umask, write_json

    old = os.umask(mask)
    try:
        assert umask() == mask
        write_json(tmp_path / "r.json", {"a": 1})
        tok = build_tokenizer()
        save(build_model(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=16),
             tok, tmp_path / "ckpt")  # fmt: skip
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o777 & ~mask
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~mask for p in (tmp_path / "ckpt").iterdir())
