"""A warm process that runs the workflow's jobs in forks of itself, so that a job does not pay ~4 s of imports.

Every CPU job of the embedded default imports torch, transformers' Qwen3 and math-verify before it does a few
seconds of work; with one job per run and per checkpoint that start-up is a large share of the whole. When
Snakemake runs jobs on this machine, the Snakefile's ``onstart`` starts :func:`serve` (``start``), which imports
those modules once and then, for each job, forks: the child is a fresh copy with everything imported, as
PyTorch's own DataLoader workers are. A job's script calls :func:`run` with the function it would have called;
``run`` hands its standard streams and arguments to the server over a Unix socket and waits for the child's exit
status. Nothing about the job changes but where its imports came from: the same function, arguments, working
folder, environment and log, and the same result (every job seeds its own random streams).

The job stays the job: a signal to the script (Snakemake stopping it) goes to the child's process group, and a
script that dies (SIGKILL) closes its socket, upon which the server kills the child's group; the server dies
with the Snakemake process that started it. ``run`` runs the function in its own process instead wherever the
server cannot serve: no server (``CALIBRL_JOBSERVER`` unset, a dry run, another host), a SLURM job (its resources
are its allocation's), or another Python (``--sdm conda``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ENV = "CALIBRL_JOBSERVER"
PRELOAD = (  # what every CPU job imports, heaviest first; the grid's backend and evaluator add theirs (start)
    "torch",
    "transformers.models.qwen3.modeling_qwen3",
    "math_verify",
    "calibrl.backends.jobs",
    "calibrl.report.jobs",
    "calibrl.toy.jobs",
)
# Imported where installed: transformers' save_pretrained unwraps the model through accelerate, which imports
# DeepSpeed when it is there (the cluster extras and the test venv have it): ~4 s in every job that saves a checkpoint.
OPTIONAL = ("deepspeed",)


# ---------------------------------------------------------------------------------------------- client
def run(target: str, log: str | None, *args, **kwargs) -> None:
    """Run ``target`` ("module:function") with ``args`` and ``kwargs`` (JSON values), logging to ``log``: in a fork
    of the job server when one serves this process, else here. Returns when it has finished; raises SystemExit
    with its exit status if it failed, or ends this process by the signal that ended it."""
    server = _server()
    if server is None:
        _call(target, log, args, kwargs)
        return
    request = {
        "target": target,
        "log": log,
        "args": args,
        "kwargs": kwargs,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(server)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        forward = {
            s: signal.signal(s, lambda sig, _: conn.sendall(b"%d\n" % sig)) for s in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            reply = conn.makefile("rb").readline()
        finally:
            for s, handler in forward.items():
                signal.signal(s, handler)
    status = json.loads(reply or b'{"exit": 1, "why": "the job server closed the connection"}')
    if status.get("signal"):
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    if status["exit"]:
        raise SystemExit(f"{target} failed in the job server's fork (exit {status['exit']}; the log says why)")


def _server() -> str | None:
    """The socket of a job server this process may use, or None."""
    path = os.environ.get(ENV)
    if not path or os.environ.get("SLURM_JOB_ID"):
        return None
    try:
        info = json.loads(Path(path + ".json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("host") != socket.gethostname() or info.get("python") != sys.executable:
        return None
    return path if os.path.exists(path) else None


def _call(target: str, log: str | None, args, kwargs) -> None:
    from calibrl.logs import failed, setup

    setup(log)
    module, _, name = target.partition(":")
    try:
        getattr(importlib.import_module(module), name)(*args, **kwargs)
    except BaseException as exc:  # into the job's log, not only the terminal
        failed(exc)
        raise


# ---------------------------------------------------------------------------------------------- server
def start(preload: tuple[str, ...] = ()) -> str | None:
    """Start a job server for this process's jobs (the Snakefile's ``onstart``), importing ``PRELOAD`` and
    ``preload`` (the modules the grid's backend and evaluator name: ``Backend.preload``, ``evaluate.preload``): its
    socket in a private temporary folder (short: Unix socket paths stop at 107 bytes), its address in
    ``CALIBRL_JOBSERVER`` for the jobs to inherit. Returns the socket's path, or None if none came up within 60 s
    (the jobs then run on their own)."""
    path = str(Path(tempfile.mkdtemp(prefix="calibrl-")) / "jobs.sock")
    cmd = [sys.executable, "-m", "calibrl.jobserver", path, str(os.getpid()), *preload]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(path + ".json"):
            os.environ[ENV] = path
            return path
        time.sleep(0.05)
    proc.kill()
    return None


def stop() -> None:
    """Stop this process's job server (the Snakefile's ``onsuccess``/``onerror``)."""
    path = os.environ.pop(ENV, None)
    if not path:
        return
    with contextlib.suppress(OSError, ValueError):
        os.kill(json.loads(Path(path + ".json").read_text())["pid"], signal.SIGTERM)


def serve(path: str, parent: int, preload: tuple[str, ...] = ()) -> None:
    """Import ``PRELOAD`` and ``preload``, then fork a child per request until ``parent`` is gone or SIGTERM
    arrives."""
    for name in (*PRELOAD, *preload):
        importlib.import_module(name)
    for name in OPTIONAL:  # a broken install costs its jobs the import again, not the server
        try:
            importlib.import_module(name)
        except ImportError:
            pass
        except Exception as err:  # e.g. DeepSpeed probing a half-installed CUDA
            print(f"calibrl.jobserver: not preloading {name}: {err!r}", file=sys.stderr)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}  # child pid -> the job's connection
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    Path(path + ".json").write_text(
        json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "python": sys.executable})
    )
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    try:
        while not stopping and os.getppid() == parent:
            for key, _ in sel.select(timeout=0.2):
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    pid, early = _fork(conn, listener)
                    children[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
                    _signal(pid, early)
                else:  # signals forwarded by the job's script, or its end (EOF): the child's group gets them
                    data = key.fileobj.recv(64)
                    if not data:
                        sel.unregister(key.fileobj)
                    _signal(key.data, data or b"%d\n" % signal.SIGKILL)
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    conn = children.pop(pid)
                    reply = {"exit": os.waitstatus_to_exitcode(status)}
                    if os.WIFSIGNALED(status):
                        reply["signal"] = os.WTERMSIG(status)
                    with contextlib.suppress(KeyError, ValueError):
                        sel.unregister(conn)
                    with contextlib.suppress(OSError):
                        conn.sendall(json.dumps(reply).encode() + b"\n")
                    conn.close()
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for p in (path, path + ".json"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def _signal(pid: int, data: bytes) -> None:
    """Send the signals in ``data`` (numbers, one a line) to the process group of child ``pid``."""
    for sig in data.split():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, int(sig))


def _fork(conn: socket.socket, listener: socket.socket) -> tuple[int, bytes]:
    """Fork a child that runs the request read from ``conn`` with the job's streams as its own; returns its pid and
    any signals the script forwarded before the request was read in full."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while b"\n" not in message:
        message += conn.recv(1 << 20)
    message, _, early = message.partition(b"\n")
    # SIGTERM held across the fork: the child must not die by, or ignore, the server's own handler for it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    pid = os.fork()
    if pid:
        with contextlib.suppress(OSError):  # its own process group from the start, whoever of the two runs first
            os.setpgid(pid, pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        for fd in fds:
            os.close(fd)
        return pid, early
    code = 1
    try:  # the child: a process group of its own (its grading workers with it), the job's streams and setting
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        listener.close()
        conn.close()
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        request = json.loads(message)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _call(request["target"], request["log"], request["args"], request["kwargs"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        if not getattr(exc, "__calibrl_logged__", False):  # _call logged it (stderr and the job's log)
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), tuple(sys.argv[3:]))
