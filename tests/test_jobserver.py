"""The job server (calibrl.jobserver): a job run in a fork of the warm server does what it does in a process of its
own, fails and stops as it would, dies with its script, and is not used where it must not be (SLURM, conda)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import filled

from calibrl import backends, evaluate, jobserver


@pytest.fixture(scope="module")
def server():
    # this test process is the "Snakemake" that owns it; it preloads what the embedded default's Snakefile does
    path = jobserver.start((*backends.get("local").preload, *evaluate.preload("local")))
    assert path and os.environ[jobserver.ENV] == path
    yield path
    jobserver.stop()


def client(target: str, *args, env: dict | None = None, log: str | None = None, **kwargs) -> subprocess.Popen:
    """A job's script: ``jobserver.run(target, ...)`` in a process of its own, as Snakemake runs a script."""
    code = "import json, sys\nfrom calibrl.jobserver import run\n"
    code += "run(*json.loads(sys.argv[1]), **json.loads(sys.argv[2]))"
    call = [sys.executable, "-c", code, json.dumps([target, log, *args]), json.dumps(kwargs)]
    return subprocess.Popen(
        call, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def pid_of(path: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_job_in_a_fork_gives_the_result_of_a_job_on_its_own(server, tmp_path):
    """A seeded toy figure (torch sampling, AdamW) through the server and in a plain process: the same tables."""
    toy = filled("config")["toy"] | {"steps": 20, "seeds": 8, "record_every": 5}
    outs = {}
    for how, env in (("served", {}), ("alone", {jobserver.ENV: ""})):
        files = [str(tmp_path / how / name) for name in ("seeds.csv.gz", "curves.csv", "stats.csv", "plot.png")]
        proc = client("calibrl.toy.jobs:figure_job", "fig2", toy, *files, env=env)
        assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
        outs[how] = {Path(f).name: Path(f).read_bytes() for f in files[1:3]}
    assert outs["served"] == outs["alone"]


def test_the_job_runs_in_the_servers_fork_and_not_where_it_must_not(server, tmp_path):
    """The job's own process: a child of the server here; the script itself under SLURM or another Python."""
    marker = tmp_path / "ppid"
    script = f"echo $PPID > {marker}"
    proc = client("subprocess:run", ["sh", "-c", script], check=True)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert pid_of(marker) != proc.pid  # ran in the server's fork
    for env in ({"SLURM_JOB_ID": "42"}, {jobserver.ENV: ""}):
        marker.unlink()
        proc = client("subprocess:run", ["sh", "-c", script], env=env, check=True)
        assert proc.wait(timeout=60) == 0 and pid_of(marker) == proc.pid, env
    info = json.loads(Path(server + ".json").read_text())
    assert info["python"] == sys.executable  # another interpreter (a conda env) would run its jobs itself


def test_failures_and_signals_reach_the_script(server, tmp_path):
    bad = client("calibrl.io:write_text", str(tmp_path), "a folder is no file")
    assert bad.wait(timeout=60) != 0 and "IsADirectoryError" in bad.stderr.read()
    pidfile = tmp_path / "sleeper"
    slow = client("subprocess:run", ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"])
    sleeper = pid_of(pidfile)
    slow.send_signal(signal.SIGTERM)  # Snakemake stopping the job
    assert slow.wait(timeout=60) == -signal.SIGTERM
    deadline = time.monotonic() + 30
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper), "the job's process group outlived the stop"


def test_a_killed_script_takes_its_job_with_it(server, tmp_path):
    pidfile = tmp_path / "sleeper"
    proc = client("subprocess:run", ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"])
    sleeper = pid_of(pidfile)
    proc.kill()  # SIGKILL: nothing forwarded, the connection closes
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(sleeper), "the job outlived its script"


@pytest.mark.parametrize("how", ["served", "alone"])
def test_a_failed_jobs_log_holds_its_failure_the_file_and_the_fix(server, tmp_path, how):
    """A checkpoint cut short (a full disk, a copy cut short) and a missing data file: the evaluation job fails,
    and its own log (the rule's log:, not only the terminal) holds the traceback and one line naming the file,
    the step and the fix; the terminal gets it once."""
    from calibrl import grid as G
    from calibrl.models import build_model, build_tokenizer, save

    config = filled("config")
    params = {**G.base_params(config, 0), "settings": {**G.eval_params(config)["settings"], "n": 2, "k": 2}}
    tok = build_tokenizer()
    policy = tmp_path / "ckpt" / "step_4" / "policy"
    save(build_model(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=16), tok, policy)
    weights = policy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    (tmp_path / "info.json").write_text(json.dumps({"path": str(policy)}))
    split = tmp_path / "test.jsonl"
    split.write_text("")
    env = {} if how == "served" else {jobserver.ENV: ""}
    cases = {
        "corrupt": ({"test": str(split)}, [str(weights), "step 4", "truncated or corrupt", f"delete {policy}"]),
        "missing": ({"test": str(tmp_path / "nope.jsonl")}, ["a file the job reads is missing", "nope.jsonl",
                                                            "Fix: rerun the rule that writes it"]),
    }  # fmt: skip
    for name, (splits, expected) in cases.items():
        log = tmp_path / f"{how}-{name}.log"
        proc = client("calibrl.evaluate:evaluate_base_job", params, str(tmp_path / "info.json"), splits,
                      str(tmp_path / "out.json"), env=env, log=str(log), workers=0)  # fmt: skip
        _, terminal = proc.communicate(timeout=300)
        assert proc.returncode != 0
        text = log.read_text()
        assert "Traceback (most recent call last)" in text, text
        failure = next(line for line in text.splitlines() if "the job failed:" in line)
        assert all(e in failure for e in expected), [e for e in expected if e not in failure]
        assert terminal.count("the job failed:") == 1, terminal[-3000:]


def test_a_script_that_sets_up_its_log_and_fails_leaves_the_failure_there(tmp_path):
    """The rules whose scripts call calibrl.logs.setup themselves (data, models, MLflow): an exception that ends
    the script is logged to the rule's log file, once, with its cause and fix."""
    log = tmp_path / "job.log"
    code = f"from calibrl.logs import setup\nsetup(r'{log}')\n"
    code += "raise FileNotFoundError(2, 'No such file or directory', 'results/data/test.jsonl')\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "results/data/test.jsonl" in text, text
    assert "a file the job reads is missing" in text and text.count("the job failed:") == 1
    assert proc.stderr.count("the job failed:") == 1, proc.stderr


def test_a_resumed_jobs_rate_and_eta_count_only_its_own_work(caplog, monkeypatch):
    """A run resumed at step 40 of 50 that does 5 steps in 10 s: 0.5 steps/s and 10 s left, not 4.5/s and 1 s."""
    import logging

    from calibrl import logs

    clock = iter([100.0, 110.0])
    monkeypatch.setattr(logs, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))  # Progress's clock only
    progress = logs.Progress("train steps", 50, logging.getLogger("t"), every=0.0, done=40)
    with caplog.at_level(logging.INFO):
        progress.update(5)
    assert "train steps 45/50 (0.50/s, elapsed 10s, ETA 10s)" in caplog.text, caplog.text
