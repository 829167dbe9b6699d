"""Nothing half-written is trusted: an evaluation or an aggregation killed (SIGKILL) at a random moment leaves
each of its output files either complete (byte-identical to an uninterrupted run) or absent, and a rerun
gives exactly the uninterrupted result. Only hidden ``.<name>.*.tmp`` files may be left, which no rule
declares."""

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
from conftest import REPO, fake_run_results, load_config

from calibrl.data import countdown
from calibrl.data.records import write_jsonl
from calibrl.models import build_model, build_tokenizer, save

KILLS_PER_JOB = 5
RUNS = [("qwen3-tiny-m", "grpo", 0), ("qwen3-tiny-m", "iac", 0), ("qwen3-tiny-m", "grpo", 1)]


def grid_config() -> dict:
    grid = load_config(REPO)["grid"]
    grid["models"] = {"qwen3-tiny-m": grid["models"]["qwen3-tiny-m"]}
    grid["tables"] = {"table2_3": ["grpo", "iac"], "table4": ["iac"], "table5": ["grpo", "iac"], "figure6": ["grpo"]}
    grid["eval"].update(n=4, k=4, max_new_tokens=6)
    return grid


def job_script(kind: str, args: dict) -> list[str]:
    """A subprocess running one job of the pipeline (grading workers need a real __main__ module)."""
    code = (
        "import json, sys\n"
        "from calibrl import pipeline\n"
        "if __name__ == '__main__':\n"
        f"    a = json.loads(sys.argv[1])\n"
        f"    pipeline.{kind}_job(**a)\n"
    )
    return [sys.executable, "-c", code, json.dumps(args)]


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except the hidden temporaries of calibrl.io.atomic_path (the folder's own
    path, which some outputs name, replaced so that two folders compare)."""
    prefix = str(root.parent).encode()
    return {
        str(p.relative_to(root)): p.read_bytes().replace(prefix, b"<root>")
        for p in sorted(root.rglob("*"))
        if p.is_file() and not (p.name.startswith(".") and p.name.endswith(".tmp"))
    }


def kill_and_rerun(
    cmd: list[str], out: Path, reference: dict[str, bytes], seconds: float, rng: random.Random, rerun: bool
) -> int:
    """SIGKILL ``cmd`` after a random delay, check what it left; then (``rerun``) rerun it, check the result."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(rng.uniform(0.3 * seconds, seconds))  # the first ~30% is Python start-up and imports
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
    return len(left)


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
    markers = []
    for step in (2, 4, 6):
        marker = root / f"step_{step}.done"
        marker.write_text(json.dumps({"step": step, "policy": str(root / "policy")}))
        markers.append(str(marker))
    return root, markers, splits


def test_interrupted_evaluation_leaves_complete_files_or_none(checkpoint, tmp_path):
    root, markers, splits = checkpoint
    grid = grid_config()

    def args(out: Path) -> dict:
        outs = [str(out / f"step_{s}.json") for s in (2, 4, 6)]
        return dict(grid=grid, markers=markers, split_paths=splits, out_paths=outs, steps=[2, 4, 6])

    ref_dir = tmp_path / "reference"
    start = time.monotonic()
    subprocess.run(job_script("evaluate", args(ref_dir)), check=True, capture_output=True)
    seconds = time.monotonic() - start
    reference = files(ref_dir)
    assert sorted(reference) == ["step_2.json", "step_4.json", "step_6.json"]

    rng = random.Random(0)
    out = tmp_path / "killed"
    left = []
    for i in range(KILLS_PER_JOB):
        shutil.rmtree(out, ignore_errors=True)  # Snakemake removes a job's outputs before running it
        last = i == KILLS_PER_JOB - 1
        left.append(kill_and_rerun(job_script("evaluate", args(out)), out, reference, seconds, rng, rerun=last))
    assert max(left) > 0  # some kill landed after a file was written, so the check had work to do


def aggregate_args(res: Path) -> dict:
    """Arguments of ``pipeline.aggregate_job`` over fake results under ``res`` (made on first use)."""
    grid = grid_config()
    grid["data"]["eval_splits"] = ["test"]
    if not (res / "runs").exists():
        fake_run_results(res, RUNS, k=4)
    evals = sorted(str(p) for p in (res / "runs").rglob("eval/step_*.json"))
    metrics = sorted(str(p) for p in (res / "runs").rglob("metrics.jsonl"))
    out = res / "out"
    return dict(
        grid=grid,
        eval_paths=evals,
        metric_paths=metrics,
        root=str(res),
        out_dir=str(out),
        store_dir=None,
        experiment=None,
        done_path=str(out / "aggregate.json"),
    )


def test_interrupted_aggregation_leaves_complete_files_or_none(tmp_path):
    args = aggregate_args

    ref = tmp_path / "reference"
    start = time.monotonic()
    subprocess.run(job_script("aggregate", args(ref)), check=True, capture_output=True)
    seconds = time.monotonic() - start
    reference = files(ref / "out")
    assert "aggregate.json" in reference and "summary.md" in reference

    rng = random.Random(1)
    res = tmp_path / "killed"
    left = []
    for i in range(KILLS_PER_JOB):
        shutil.rmtree(res / "out", ignore_errors=True)
        last = i == KILLS_PER_JOB - 1
        cmd = job_script("aggregate", args(res))
        left.append(kill_and_rerun(cmd, res / "out", reference, seconds, rng, rerun=last))
    assert max(left) > 0


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
    tables = Path(args["out_dir"]) / "tables"
    tables.mkdir(parents=True)
    (tables / ".table5_vs_paper.md.x1y2.tmp").write_text("half a table")
    subprocess.run(job_script("aggregate", args), check=True, capture_output=True)
    listed = json.loads(Path(args["done_path"]).read_text())["tables"]
    assert listed == sorted(str(p) for p in tables.iterdir() if not p.name.startswith("."))
    assert "table5_vs_paper.md" in {Path(p).name for p in listed}
