"""ray_cluster.sh starts a private Ray cluster: real Ray 2.55 (the version OpenRLHF 0.11.2 pins) on CPU, on this host.

Ray runs from its own venv, ``.venv-cluster`` (``make .venv-cluster/.installed``, which ``make test`` builds first),
plain ``ray==2.55.0`` (no dashboard package). The tests run the script itself outside SLURM, where it starts a
one-node cluster on this host, with a probe as its COMMAND: a client that holds the job's token connects and runs a
task; clients with no token, with a wrong token, or with token authentication switched off are refused by the
cluster. The cluster is the user's alone on a shared node too: its own temp directories (removed at exit), not
another user's leftover /tmp/ray, and free ports, so that two clusters run side by side; each node announces a
routable address, loopback only where every node is on this host.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import free_port, ray_python

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "src" / "calibrl" / "gpu" / "ray_cluster.sh"
NOBODY = 65534  # another user, for the tests that run as root

# Runs inside the cluster as ray_cluster.sh's COMMAND, with the environment the script exports.
# probe.py RESULT                  the refusals: no token, token authentication off, a wrong token
# probe.py RESULT OWN PEER         side by side with another cluster: publish this address in OWN, read the
#                                  other's from PEER, which must refuse this cluster's token; exit together
PROBE = r"""
import json, os, stat, subprocess, sys, time

import ray

env = os.environ
address, tmpdir = env["RAY_ADDRESS"], env["RAY_TMPDIR"]
out = {"address": address, "mode": env.get("RAY_AUTH_MODE"), "uid": os.getuid(), "tmpdir": tmpdir}
token = env["RAY_AUTH_TOKEN_PATH"]
out["token_path"] = token
out["token_mode"] = stat.S_IMODE(os.stat(token).st_mode)
out["dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(token)).st_mode)
out["token_len"] = len(open(token).read().strip())
out["current_cluster"] = open(os.path.join(tmpdir, "ray", "ray_current_cluster")).read()

ray.init(address=address, logging_level="ERROR", log_to_driver=False)
out["head_temp_dir"] = ray._private.worker.global_worker.node.get_temp_dir_path()
dirs = (tmpdir, os.path.dirname(out["head_temp_dir"]))
out["dirs"] = {d: [stat.S_IMODE(os.stat(d).st_mode), os.stat(d).st_uid] for d in dirs}
out["node_ips"] = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
out["with_token"] = ray.get(ray.remote(lambda x: x * 2).remote(21))
ray.shutdown()


def wait_for(path):
    for _ in range(600):
        if os.path.exists(path):
            return open(path).read()
        time.sleep(0.5)
    sys.exit(f"no {path}")


CLIENT = (
    "import sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR');"
    " print('CONNECTED', ray._private.worker.global_worker.node.gcs_address)"
)
base = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
clients = {"auto": ({k: v for k, v in env.items() if k != "RAY_ADDRESS"}, "auto")}  # a bare ray.init()
if len(sys.argv) == 2:
    clients["no_token"] = (base, address)
    clients["auth_off"] = ({**base, "RAY_AUTH_MODE": "disabled"}, address)
    clients["wrong_token"] = ({**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, address)
else:
    own, peer = sys.argv[2:4]
    with open(own + ".tmp", "w") as f:
        f.write(address)
    os.rename(own + ".tmp", own)
    clients["peer"] = (env, wait_for(peer))
procs = {  # side by side: each refusal takes Ray's connection retries
    name: subprocess.Popen([sys.executable, "-c", CLIENT, addr], env=e, stdout=-1, stderr=-1, text=True)
    for name, (e, addr) in clients.items()
}
for name, p in procs.items():
    stdout, stderr = p.communicate(timeout=180)
    out[name] = {"rc": p.returncode, "connected": stdout.split()[1:] or None, "stderr": stderr[-3000:]}
if len(sys.argv) > 2:
    open(own + ".done", "w").close()
    wait_for(peer + ".done")  # the other cluster probes this one until then
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


def script_env(**extra_env: str) -> dict:
    python = ray_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_"))}
    env.update(RAY_CPUS_PER_NODE="1", RAY_BIN=str(python.parent / "ray"), RAY_PYTHON=str(python), **extra_env)
    return env


def start_cluster(work: Path, *probe_args: str, prefix=(), **extra_env: str) -> subprocess.Popen:
    """ray_cluster.sh with the probe as COMMAND (behind ``prefix``, e.g. an srun step)."""
    home = work / "home"  # no ~/.ray/auth_token here: a client finds no token by accident
    home.mkdir()
    probe = work / "probe.py"
    probe.write_text(PROBE)
    env = script_env(HOME=str(home), RAY_JOIN_TIMEOUT="180", **extra_env)
    return subprocess.Popen(
        [*prefix, "bash", str(SCRIPT), env["RAY_PYTHON"], str(probe), str(work / "result.json"), *probe_args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, work: Path) -> tuple[dict, str]:
    """The probe's findings and the script's log, once the script has ended (its status 0)."""
    try:
        log, _ = proc.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script's trap stops Ray and removes the token
        log, _ = proc.communicate(timeout=60)
        pytest.fail(f"ray_cluster.sh did not finish:\n{log[-4000:]}")
    assert proc.returncode == 0, log[-6000:]
    return json.loads((work / "result.json").read_text()), log


def check_private(out: dict, home: Path, refusals=("no_token", "auth_off", "wrong_token")) -> None:
    assert out["mode"] == "token"
    token = Path(out["token_path"])
    assert token.is_relative_to(home / ".calibrl" / "ray")
    assert out["token_mode"] == 0o600 and out["dir_mode"] == 0o700 and out["token_len"] == 64
    assert out["with_token"] == 42
    for name in refusals:
        client = out[name]
        assert client["rc"] != 0 and not client["connected"], (name, client)
        assert "AuthenticationError" in client["stderr"] or "authentication" in client["stderr"].lower(), (
            name,
            client["stderr"],
        )
    # a bare ray.init() (no RAY_ADDRESS) finds this cluster in RAY_TMPDIR, not another one on the host
    assert out["current_cluster"] == out["address"]
    assert out["auto"]["connected"] == [out["address"]], out["auto"]
    host = out["address"].rsplit(":", 1)[0]
    assert out["node_ips"] == [host]  # the address announced by the head is the one the driver joins
    # the driver's and the head's temp directories: the user's, closed to others, gone with the cluster
    for path, (mode, uid) in out["dirs"].items():
        assert mode == 0o700 and uid == out["uid"], (path, oct(mode), uid)
        assert not Path(path).exists(), path
    assert len(out["head_temp_dir"].encode()) <= 41  # room for Ray's socket paths (107 bytes)
    assert not token.parent.exists()  # the token dies with the cluster
    assert stat.S_IMODE((home / ".calibrl" / "ray").stat().st_mode) == 0o700
    assert processes_mentioning(str(token)) == []  # no Ray process outlives the script


def snapshot(folder: Path) -> dict:
    return {str(p): (p.lstat().st_mode, p.lstat().st_mtime_ns) for p in [folder, *folder.rglob("*")]}


def test_ray_cluster_admits_only_the_token_holder_beside_a_leftover_ray_dir(tmp_path):
    """TMPDIR holds another user's Ray temp dir (Ray's default is $TMPDIR/ray, else /tmp/ray) with a
    ray_current_cluster naming a cluster that is gone: `ray start` would make its session there (a PermissionError
    for a user who cannot write there) and a bare ray.init() would join that address. The script's cluster admits
    only the token holder, a bare ray.init() joins it, and nothing of it touches that folder. Root may write
    anywhere, so where the tests run as root the folder is the other user's and the check is that it stays
    untouched; as an ordinary user it is also read-only."""
    ray_dir = tmp_path / "tmp" / "ray"
    ray_dir.mkdir(parents=True)
    (ray_dir / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    (ray_dir / "session_latest").symlink_to(ray_dir / "session_2026-01-01_00-00-00_000000_1")
    if os.geteuid() == 0:
        for path in (ray_dir, ray_dir / "ray_current_cluster"):
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    else:
        ray_dir.chmod(0o555)
    before = snapshot(ray_dir)
    work = tmp_path / "run"
    work.mkdir()
    out, _ = finish(start_cluster(work, TMPDIR=str(ray_dir.parent)), work)
    check_private(out, work / "home")
    assert Path(out["head_temp_dir"]).parent.name.startswith(f"ray-{os.getuid()}-")  # ray-<uid>-<pid>.XXXXXX
    assert snapshot(ray_dir) == before


def test_two_clusters_side_by_side_each_with_its_own_token(tmp_path):
    """Two clusters on this host at once, with Ray's default ports left to the script: both come up, run a
    task, and each refuses the other's token. One makes its temp dirs under a RAY_TMPDIR too long for the
    <RAY_TMPDIR>/ray-<uid>-<pid>.XXXXXX form, and gets the short one."""
    short = Path(tempfile.mkdtemp(prefix="calibrl-rt-", dir="/tmp"))  # 24 bytes: only r.XXXXXX fits
    assert 23 < len(str(short)) <= 28
    try:
        works = [tmp_path / "a", tmp_path / "b"]
        for work in works:
            work.mkdir()
        info = [str(work / "address") for work in works]
        procs = [
            start_cluster(works[0], info[0], info[1]),
            start_cluster(works[1], info[1], info[0], RAY_TMPDIR=str(short)),
        ]
        (a, _), (b, _) = [finish(proc, work) for proc, work in zip(procs, works)]
        assert a["address"] != b["address"]
        for out, work in ((a, works[0]), (b, works[1])):
            check_private(out, work / "home", refusals=("peer",))
        head = Path(b["head_temp_dir"]).parent
        assert head.parent == short and head.name.startswith("r.") and Path(b["tmpdir"]).parent == short
        assert not list(short.iterdir())
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_too_long_temp_dir_fails_naming_the_limit(tmp_path):
    base = "/tmp/" + "x" * 40
    proc = subprocess.run(
        ["bash", str(SCRIPT), "true"],
        env=script_env(HOME=str(tmp_path), RAY_TMPDIR=base),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"RAY_TMPDIR={base} is too long" in proc.stderr and "107 bytes" in proc.stderr, proc.stderr
    assert not (tmp_path / ".calibrl").exists()  # nothing made before the check


def interface_addresses() -> dict[str, str]:
    """This host's network interfaces and their IPv4 addresses."""
    found = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        found[name] = socket.inet_ntoa(packed[20:24])
    return found


def node_ip(*peers: str, **extra_env: str) -> subprocess.CompletedProcess:
    """`ray_cluster.sh --node-ip PEER...`: the address this host would announce to the peers."""
    env = script_env(**extra_env)
    return subprocess.run(["bash", str(SCRIPT), "--node-ip", *peers], env=env, capture_output=True, text=True)


def test_node_address_is_routable_loopback_only_within_this_host():
    """Each node announces the address of its route to its peers (a worker's: the head; the head's: the other
    nodes): loopback only when every peer is on loopback, as on the test cluster of scripts/local_slurm.sh."""
    loop = node_ip("127.0.0.1")
    assert loop.returncode == 0 and loop.stdout.strip() == "127.0.0.1", loop.stderr
    interfaces = interface_addresses()
    inward = [name for name, ip in interfaces.items() if ipaddress.ip_address(ip).is_loopback]
    outward = {name: ip for name, ip in interfaces.items() if name not in inward}
    if not outward:
        pytest.skip("no network interface but loopback here")
    name, ip = next(iter(outward.items()))
    for peers in ([ip], ["127.0.0.1", ip]):  # a peer off loopback wins
        found = node_ip(*peers)
        assert found.returncode == 0 and found.stdout.strip() == ip, (peers, found.stderr)
    assert node_ip("127.0.0.1", RAY_IFACE=name).stdout.strip() == ip
    # a loopback address that a peer off this host would need: refused, with what to set
    for refused in (node_ip(ip, RAY_IFACE=inward[0]), node_ip(ip, RAY_NODE_IP_ADDRESS="127.0.0.1")):
        assert refused.returncode == 1 and "is a loopback address" in refused.stderr, refused.stderr
        assert "RAY_IFACE" in refused.stderr and refused.stdout == ""


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("local_slurm")
def test_ray_cluster_inside_the_executors_slurm_step(tmp_path):
    """As the SLURM executor runs a rule: the script inside an `srun -n1` step on a real (single-node) SLURM.
    The head is a step of its own beside it (srun --overlap, the enclosing step's SLURM_* removed)."""
    step = ["srun", "-n1", "--cpu-bind=q", "--cpus-per-task=1", "--nodes=1"]  # the plugin's own wrapper
    out, log = finish(start_cluster(tmp_path, prefix=step), tmp_path)
    # the allocation's node (the local SLURM's node name resolves to loopback), not the script's no-SLURM mode
    assert f"head {socket.gethostname()} (" in log and "1 node(s) up" in log, log[-3000:]
    check_private(out, tmp_path / "home")
