"""The training canary, a preflight check of a GPU backend's training shapes: each kind of run trains as it will.

The preflight's other checks start an engine, run a collective, import a kernel; none runs a training step. What
only a step on the site's GPUs exercises (the DLC composite under vLLM's GPU runner with CUDA graphs and its
``load_weights`` after capture, the memory's weight sync by CUDA IPC, the memory trainer's FSDP2 ranks on NCCL,
DeepSpeed's ``offload_states`` beside a sleeping engine and a resume from what it saved, packing with dynamic
batches, the divergence check in bf16, the memory each GPU peaks at, several ranks per role, two nodes) would
otherwise fail in the first paper job, after the queue. So for each kind of run of the shape
(``calibrl.preflight.canaries``: plain with its reference KL, DAPO, DLC), the canary writes the run's settings.json
with its method, batch and layout unchanged, trains 2 steps through the training job's own path (the backend's
``train``: OpenRLHF's ``train_ppo_ray``, verl's ``main_ppo``, each under ``ray_cluster.sh``), saves, and resumes for
a third in a second launch, as the next segment would. It then reads the run's metrics (the backend's ``metrics``:
every step there; DLC's divergence check and memory loss logged) and, where NVML sees the GPUs, the peak memory each
reached. A failure names the kind, the run it stands for, the segment, the log file and what its last lines say.
Each backend's check is :func:`check` with its :class:`Trainer` (``calibrl.backends.canary_check``).
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("calibrl.gpu.canary")


class Failed(RuntimeError):
    """A canary that failed: ``cause`` (what was seen) and ``fix``; its backend's check reports it as the
    preflight's ``CheckFailed``."""

    def __init__(self, cause: str, fix: str):
        super().__init__(cause)
        self.cause, self.fix = cause, fix


@dataclass(frozen=True)
class Trainer:
    """What the canary asks of a GPU backend."""

    package: str  # its folder's package (by name: this layer imports no backend), whose ``BACKEND`` trains a segment
    # as rule train does and writes the run's metrics.jsonl as rule metrics does
    dlc_tolerance: float  # the divergence check's limit of its DLC
    clip: str  # its metrics' name of the clip fraction


TAIL = 40  # log lines searched for a known cause
# (what a log line says, what it means, the fix): the first match names the failure
CAUSES = (
    ("rehearsal fault", "an injected rehearsal fault killed the job", "none: the rehearsal's fault test"),
    # before the GPU's: Ray's memory monitor says "out of memory" too
    ("running low on memory", "the node's host memory ran low: Ray's memory monitor killed a worker",
     "ask for more host memory (the profile's mem_mb for the rule) or run fewer jobs per node; set adam_offload / "
     "ref_offload only where host memory is ample (docs/cluster.md, GPUs per run)"),
    ("out of memory", "a GPU ran out of memory",
     "lower vllm_gpu_memory_utilization or max_tokens_per_gpu, or set adam_offload / ref_offload in the model's "
     "resources (docs/cluster.md, memory per GPU)"),
    ("NCCL", "a NCCL collective failed", "NCCL_DEBUG=INFO in the profile's env shows the interfaces; set "
     "NCCL_SOCKET_IFNAME / NCCL_IB_HCA (docs/cluster.md, Ray on a shared cluster)"),
    ("DivergenceCheckFailed", "DLC's engines sample from another distribution than the memory actor computes",
     "check the engines' log for DLCQwen3ForCausalLM; docs/cluster.md, DLC"),
    ("no progress for", "the trainer logged no step within the layout's stall_minutes (calibrl.gpu.watchdog)",
     "a worker likely died under the trainer: read the log above the watchdog's line for its error"),
    ("CUDA error", "a CUDA kernel failed", "the driver, the torch build and the GPUs' architecture must match "
     "(the preflight's driver and compiler checks)"),
)  # fmt: skip


def check(p: dict, trainer: Trainer) -> str:
    """Rule preflight's check ``canary``: every canary run of ``p["canary"]`` in turn; what each did."""
    if not p.get("canary"):
        return "no training run on this shape"
    root = Path(p["results"]) / "preflight" / "canary" / p["shape"]
    return "; ".join(_one(c, root / c["kind"], Path(p["results"]), int(p["workers"]), trainer) for c in p["canary"])


def _one(c: dict, run_dir: Path, results: Path, workers: int, trainer: Trainer) -> str:
    from calibrl.checkpoints import RunStamp, settings_job

    shutil.rmtree(run_dir, ignore_errors=True)  # a canary starts fresh: nothing of an earlier one resumes
    run_dir.mkdir(parents=True)
    settings = run_dir / "settings.json"
    settings_job(c["settings"], c["resources"], str(settings), {k: str(results / v) for k, v in c["inputs"].items()})
    what = f"canary {c['kind']} (as {c['run']})"
    train = RunStamp.read(settings).train  # what the run trains with: the stamp it reads
    segments = (int(train["eval_every"]), int(train["steps"]))  # a checkpoint ends the first, the second resumes it
    seconds = []
    with _PeakMemory() as peak:
        for end in segments:
            logfile = run_dir / f"segment_{end}.log"
            start = time.monotonic()
            code = _train(trainer.package, settings, end, workers, logfile)
            seconds.append(time.monotonic() - start)
            if code:
                cause, fix = _cause(logfile)
                resumed = " (the resume)" if end != segments[0] else ""
                raise Failed(f"{what}: training to step {end}{resumed} failed (exit {code}): {cause}; see {logfile}",
                             fix)  # fmt: skip
    importlib.import_module(trainer.package).BACKEND.metrics(str(run_dir), str(run_dir / "metrics.jsonl"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    if steps != list(range(1, segments[-1] + 1)):
        raise Failed(f"{what}: trained, but its metrics have steps {steps}, not 1-{segments[-1]}",
                     f"read {run_dir}/segment_*.log: a segment ended early or repeated steps")  # fmt: skip
    notes = [f"{what}: steps 1-{segments[-1]} in 2 launches ({' + '.join(f'{s:.0f}' for s in seconds)} s)"]
    if c["kind"] == "dlc":
        checked = [r["dlc/check_mean_abs"] for r in rows if "dlc/check_mean_abs" in r]
        if not checked or not any("dlc/memory_loss" in r for r in rows):
            raise Failed(f"{what}: no divergence check or memory loss was logged",
                         "the DLC patch did not act: read the segment logs for 'DLC'")  # fmt: skip
        if max(checked) > trainer.dlc_tolerance:  # the trainer raises past it; a log that says otherwise is not a pass
            raise Failed(
                f"{what}: DLC's divergence check logged {max(checked):.3g}, over {trainer.dlc_tolerance:g}",
                "the engines sample from another distribution than the memory actor: docs/cluster.md, DLC",
            )
        notes.append(f"divergence {max(checked):.3g} (limit {trainer.dlc_tolerance:g}), memory loss logged")
    clip = [r[trainer.clip] for r in rows if trainer.clip in r]
    if clip:
        notes.append(f"clip fraction up to {max(clip):.3g}")
    notes.append(peak.summary())
    return ", ".join(notes)


def _train(package: str, settings: Path, end: int, workers: int, logfile: Path) -> int:
    """One segment as rule train runs it (the backend's ``train``), its output in ``logfile``; the exit code."""
    code = (
        f"import sys; from {package} import BACKEND; "
        "BACKEND.train(sys.argv[1], int(sys.argv[2]), threads=1, workers=int(sys.argv[3]))"
    )
    with open(logfile, "wb") as out:
        proc = subprocess.run([sys.executable, "-c", code, str(settings), str(end), str(workers)],
                              stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    return proc.returncode


def _cause(logfile: Path) -> tuple[str, str]:
    """What the log's last lines say went wrong, and its fix."""
    lines = logfile.read_text(errors="replace").splitlines()[-TAIL:]
    for needle, meaning, fix in CAUSES:
        hit = next((line.strip() for line in reversed(lines) if needle.lower() in line.lower()), None)
        if hit:
            return f"{meaning} ({hit[-300:]})", fix
    last = next((line.strip() for line in reversed(lines) if "Error" in line), lines[-1].strip() if lines else "")
    return f"last error line: {last[-300:]}", f"read {logfile}"


class _PeakMemory:
    """The largest memory in use on each GPU NVML shows this job while the canary trains (sampled each second)."""

    def __enter__(self) -> _PeakMemory:
        self.peaks: dict[int, int] = {}
        self.totals: dict[int, int] = {}
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as exc:  # no GPU, no NVML: nothing to sample
            self._handles, self._why = [], f"{type(exc).__name__}"
        if self._handles:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            for i, h in enumerate(self._handles):
                info = self._nvml.nvmlDeviceGetMemoryInfo(h)
                self.peaks[i] = max(self.peaks.get(i, 0), int(info.used))
                self.totals[i] = int(info.total)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._handles:
            self._thread.join(timeout=5)

    def summary(self) -> str:
        if not self.peaks:
            return "peak GPU memory not measured (no GPU seen by NVML)"
        worst = max(self.peaks, key=lambda i: self.peaks[i] / self.totals[i])
        return (
            f"peak GPU memory {self.peaks[worst] / 2**30:.1f} of {self.totals[worst] / 2**30:.1f} GiB "
            f"(GPU {worst}; {len(self.peaks)} GPUs sampled)"
        )
