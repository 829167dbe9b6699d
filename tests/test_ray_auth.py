"""ray_cluster.sh starts a private Ray cluster: real Ray 2.55 (the version OpenRLHF 0.11.2 pins) on CPU, loopback only.

Ray runs from its own venv, ``.venv-cluster`` (``make .venv-cluster/.installed``, which ``make test`` builds first),
plain ``ray==2.55.0`` (no dashboard package). The test runs the script itself (its token set-up and its head
start) outside SLURM, where it starts a one-node cluster on 127.0.0.1, with a probe as its COMMAND: a client that
holds the job's token connects and runs a task; clients with no token, with a wrong token, or with token
authentication switched off are refused by the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import free_port, ray_python
from test_slurm import local_slurm  # noqa: F401  (the fixture: a real SLURM on loopback)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "src" / "calibrl" / "backends" / "openrlhf" / "ray_cluster.sh"

# Runs inside the cluster as ray_cluster.sh's COMMAND, with the environment the script exports.
PROBE = r"""
import json, os, stat, subprocess, sys

import ray

out = {"address": os.environ["RAY_ADDRESS"], "mode": os.environ.get("RAY_AUTH_MODE")}
token = os.environ["RAY_AUTH_TOKEN_PATH"]
out["token_path"] = token
out["token_mode"] = stat.S_IMODE(os.stat(token).st_mode)
out["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(token)).st_mode)
out["token_len"] = len(open(token).read().strip())

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
out["with_token"] = ray.get(ray.remote(lambda x: x * 2).remote(21))
ray.shutdown()

CLIENT = "import os, ray; ray.init(address=os.environ['RAY_ADDRESS'], logging_level='ERROR'); print('CONNECTED')"
base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
clients = {
    "no_token": base,
    "auth_off": {**base, "RAY_AUTH_MODE": "disabled"},
    "wrong_token": {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
}
procs = {  # side by side: each refusal takes Ray's connection retries
    name: subprocess.Popen([sys.executable, "-c", CLIENT], env=env, stdout=-1, stderr=-1, text=True)
    for name, env in clients.items()
}
for name, p in procs.items():
    stdout, stderr = p.communicate(timeout=180)
    out[name] = {"rc": p.returncode, "connected": "CONNECTED" in stdout, "stderr": stderr[-3000:]}
json.dump(out, open(sys.argv[1], "w"))
"""


def processes_mentioning(text: str) -> list[int]:
    """Pids whose environment holds ``text`` (what the cluster's Ray processes inherit from the script)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if text.encode() in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def run_cluster(tmp_path: Path, prefix: list[str] = (), **extra_env: str) -> tuple[dict, Path, str]:
    """ray_cluster.sh with the probe as COMMAND (behind ``prefix``, e.g. an srun step); the probe's findings."""
    python = ray_python()
    home = tmp_path / "home"  # no ~/.ray/auth_token here: a client finds no token by accident
    home.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    result = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_"))}
    env.update(
        HOME=str(home),
        RAY_PORT=str(free_port()),
        RAY_CPUS_PER_NODE="1",
        RAY_BIN=str(python.parent / "ray"),
        RAY_PYTHON=str(python),
        RAY_JOIN_TIMEOUT="180",
        **extra_env,
    )
    proc = subprocess.Popen(
        [*prefix, "bash", str(SCRIPT), str(python), str(probe), str(result)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script's trap stops Ray and removes the token
        log, _ = proc.communicate(timeout=60)
        pytest.fail(f"ray_cluster.sh did not finish:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]
    return json.loads(result.read_text()), home, log


def check_private(out: dict, home: Path) -> None:
    assert out["mode"] == "token"
    token = Path(out["token_path"])
    assert token.is_relative_to(home / ".calibrl" / "ray")
    assert out["token_mode"] == 0o600 and out["dir_mode"] == 0o700 and out["token_len"] == 64
    assert out["with_token"] == 42
    for name in ("no_token", "auth_off", "wrong_token"):
        client = out[name]
        assert client["rc"] != 0 and not client["connected"], (name, client)
        assert "AuthenticationError" in client["stderr"] or "authentication" in client["stderr"].lower(), (
            name,
            client["stderr"],
        )
    assert not token.parent.exists()  # the token dies with the cluster
    assert stat.S_IMODE((home / ".calibrl" / "ray").stat().st_mode) == 0o700
    assert processes_mentioning(str(token)) == []  # no Ray process outlives the script


def test_ray_cluster_admits_only_the_token_holder(tmp_path):
    out, home, _ = run_cluster(tmp_path)
    assert out["address"].startswith("127.0.0.1:")
    check_private(out, home)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("local_slurm")
def test_ray_cluster_inside_the_executors_slurm_step(tmp_path):
    """As the SLURM executor runs a rule: the script inside an `srun -n1` step on a real (single-node) SLURM.
    The head is a step of its own beside it (srun --overlap, the enclosing step's SLURM_* removed)."""
    step = ["srun", "-n1", "--cpu-bind=q", "--cpus-per-task=1", "--nodes=1"]  # the plugin's own wrapper
    out, home, log = run_cluster(tmp_path, step)
    # the allocation's node (the local SLURM's node name resolves to loopback), not the script's no-SLURM mode
    assert f"head {socket.gethostname()} (" in log and "1 node(s) up" in log, log[-3000:]
    check_private(out, home)
