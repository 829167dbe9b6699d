"""The cluster path for real: `snakemake --profile slurm` against a SLURM on loopback.

scripts/local_slurm.sh starts SLURM (installing it with apt-get if needed; root only): partition cpu (one node)
and partition gpu (two nodes with 8 stand-in GPUs each). The workflow runs a micro config through sbatch with
slurm/config.yaml layered with tests/slurm_overlay.yaml (partition cpu, no GPUs); a two-rule Snakefile checks
that failed jobs are resubmitted as the profile says; the paper's two-node layout gets its nodes and GPUs from
SLURM and its Ray placement groups from a Ray cluster spanning them.
"""

import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SNAKEMAKE_ON_SLURM, copy_workflow, load_config, ray_python, run, write_config

# slow too: minutes, and `-m "not slow"` quick runs should not start daemons
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

OVERLAY = REPO / "tests" / "slurm_overlay.yaml"
PROFILE = ["--profile", "slurm", "--profile", str(OVERLAY)]
# Jobs that go through sbatch; aggregate and toy_mlflow are local rules and run in Snakemake itself.
REMOTE_RULES = {
    "toy_figure": 5,
    "data_synthetic": 4,  # sft, train, test, ood
    "toy_verdicts": 1,
    "warmstart": 1,
    "train": 1,
    "evaluate": 1,
    "evaluate_base": 1,
}
LOCAL_RULES = {"aggregate", "toy_mlflow", "grid_mlflow", "run_settings"}
# The profile runs every SLURM job in the cluster's GPU venv (its precommand); here that is this interpreter's.
JOB_ENV = {**os.environ, "CALIBRL_GPU_VENV": sys.prefix}


def snakemake_slurm(workdir: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    return run([*SNAKEMAKE_ON_SLURM, *PROFILE, *args], cwd=workdir, timeout=timeout, env=JOB_ENV)


# ----------------------------------------------------------------------------------------- cluster
def slurmctld_log() -> str:
    conf = run(["scontrol", "show", "config"]).stdout
    path = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", conf, re.M).group(1)
    return Path(path).read_text(errors="replace")


def submitted_jobs(output: str) -> dict[str, str]:
    """SLURM job id -> log file, from Snakemake's 'has been submitted with SLURM jobid' lines."""
    pattern = r"has been submitted with SLURM jobid (\d+) \(log: (\S+?)\)\."
    return dict(re.findall(pattern, output))


# -------------------------------------------------------------------------------------- workflow
def micro_config(workdir: Path) -> dict:
    """Far smaller than test_workflow_grid's: one model, one method, one checkpoint (the point is the path)."""
    cfg = load_config(workdir)
    cfg["toy"].update(steps=10, seeds=2, record_every=5)
    grid = cfg["grid"]
    grid["data"]["splits"] = {"sft": 16, "train": 8, "test": 4, "ood": 2}
    grid["models"] = {
        "qwen3-tiny-m": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 16}
    }
    grid.pop("memory_models", None)
    grid["main_model"] = "qwen3-tiny-m"
    grid["warmstart"].update(steps=2, batch_size=4)
    grid["train"].update(steps=2, eval_every=2, prompts_per_step=2, group_size=2, filter_samples=2)
    grid["eval"].update(n=8, k=8)  # the tables report AVG@8 / PASS@8
    grid["extra_seeds"] = {}
    grid["methods"] = {"grpo": grid["methods"]["grpo"]}
    grid["tables"] = {"table2_3": ["grpo"], "table4": ["grpo"], "table5": ["grpo"], "figure6": ["grpo"]}
    return cfg


@pytest.fixture
def slurm_workflow(tmp_path: Path) -> Path:
    workdir = copy_workflow(tmp_path)
    shutil.copytree(REPO / "slurm", workdir / "slurm")  # `--profile slurm` looks in the working directory
    cfg = micro_config(workdir)
    write_config(workdir / "micro.yaml", cfg)  # a named config file is the whole config
    return workdir


def test_workflow_runs_through_sbatch(local_slurm, slurm_workflow):
    wd = slurm_workflow
    proc = snakemake_slurm(wd, "--configfile", "micro.yaml", timeout=480)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert "Using profiles slurm and" in output

    res = wd / "results"
    assert (res / "tables" / "table2.md").read_text().startswith("### Table 2")
    assert (res / "toy" / "verdicts.md").stat().st_size > 0

    # Every non-local job went through sbatch: a SLURM job id, a per-rule SLURM log (the overlay keeps
    # them), and slurmctld's record of the job exiting 0.
    jobs = submitted_jobs(output)
    assert len(jobs) == sum(REMOTE_RULES.values()), output[-4000:]
    logs = sorted((wd / ".snakemake" / "slurm_logs").glob("rule_*/**/*.log"))
    per_rule = {
        rule: sum(p.relative_to(wd / ".snakemake" / "slurm_logs").parts[0] == f"rule_{rule}" for p in logs)
        for rule in REMOTE_RULES
    }
    assert per_rule == REMOTE_RULES
    assert {p.stem for p in logs} == set(jobs)
    for log in logs:
        assert "--executor slurm-jobstep" in log.read_text()  # the job ran Snakemake's SLURM job step
    for rule in LOCAL_RULES:
        assert not (wd / ".snakemake" / "slurm_logs" / f"rule_{rule}").exists()
    ctld = slurmctld_log()
    for job_id in jobs:
        assert re.search(rf"_job_complete: JobId={job_id} WEXITSTATUS 0", ctld), f"job {job_id} not seen exiting 0"

    # The overlay's resources reached sbatch: the evaluation job ran in partition cpu with 1500 MB, no GPU.
    eval_id = next(j for j, log in jobs.items() if "/rule_evaluate/" in log)
    show = run(["scontrol", "show", "job", eval_id]).stdout
    if show:  # slurmctld forgets finished jobs after MinJobAge (300 s)
        assert "Partition=cpu" in show and "mem=1500M" in show and "gres/gpu" not in show, show

    # Up to date; under the profile's rerun triggers a setting that changes no result (grading workers)
    # reruns nothing, and a training setting retrains the run (its params are the run's slice only).
    again = snakemake_slurm(wd, "--configfile", "micro.yaml", "-n", timeout=120)
    assert "Nothing to be done" in again.stdout + again.stderr
    edited = micro_config(wd)
    edited["grid"]["workers"] = 2
    write_config(wd / "micro_edited.yaml", edited)
    kept = snakemake_slurm(wd, "--configfile", "micro_edited.yaml", "-n", timeout=120)
    assert "Nothing to be done" in kept.stdout + kept.stderr, kept.stdout[-3000:]
    edited["grid"]["train"]["lr"] = 0.001
    write_config(wd / "micro_lr.yaml", edited)
    retrain = snakemake_slurm(wd, "--configfile", "micro_lr.yaml", "-n", timeout=120)
    assert re.search(r"^train\s+1$", retrain.stdout, re.M), retrain.stdout[-3000:]


# ---------------------------------------------------------------------------------------- retries
RETRY_SNAKEFILE = """\
# Fails on purpose: `flaky` on its first attempt only, `broken` on every attempt.
rule all:
    input:
        "flaky.done",
        "broken.done",


rule flaky:
    output:
        "flaky.done",
    resources:
        try_no=lambda wildcards, attempt: attempt,
    shell:
        'echo "$SLURM_JOB_ID {resources.try_no}" >> flaky.attempts; test {resources.try_no} -ge 2; touch {output}'


rule broken:
    output:
        "broken.done",
    resources:
        try_no=lambda wildcards, attempt: attempt,
    shell:
        'echo "$SLURM_JOB_ID {resources.try_no}" >> broken.attempts; exit 1'
"""


def test_failed_jobs_are_resubmitted_per_profile(local_slurm, tmp_path):
    shutil.copytree(REPO / "slurm", tmp_path / "slurm")
    (tmp_path / "retry.smk").write_text(RETRY_SNAKEFILE)
    proc = snakemake_slurm(tmp_path, "--snakefile", "retry.smk", timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, "broken fails on every attempt, so the run must fail"

    def attempts(name):
        return [line.split() for line in (tmp_path / f"{name}.attempts").read_text().splitlines()]

    flaky, broken = attempts("flaky"), attempts("broken")
    assert [a for _, a in flaky] == ["1", "2"]  # resubmitted once, then succeeded
    assert [a for _, a in broken] == ["1", "2", "3"]  # retries: 2 -> three attempts, no more
    job_ids = [j for j, _ in flaky + broken]
    assert len(set(job_ids)) == 5 and all(j.isdigit() for j in job_ids)  # each attempt a new SLURM job
    assert set(submitted_jobs(output)) == set(job_ids)
    assert (tmp_path / "flaky.done").exists()  # keep-going: broken did not stop flaky
    assert output.count("Trying to restart job") == 3


# ------------------------------------------------------------------------------- preemption/resume
def test_preempted_training_resumes_and_keeps_finished_evaluations(local_slurm, slurm_workflow):
    """A run is extended (more steps); while one of its training jobs (one per checkpoint) runs it is suspended
    and cancelled, as a preemption does. The profile resubmits it, it resumes from the last checkpoint, and no
    checkpoint is evaluated twice: the evaluations made before (one job per checkpoint) are kept as they are."""
    wd = slurm_workflow
    cfg = micro_config(wd)
    cfg["grid"]["train"].update(steps=2, eval_every=2)
    write_config(wd / "short.yaml", cfg)
    run_dir = wd / "results" / "runs" / "qwen3-tiny-m" / "grpo" / "s0"
    evals = [str((run_dir / "eval" / f"step_{k}.json").relative_to(wd)) for k in range(2, 7, 2)]
    first = snakemake_slurm(wd, *evals[:1], "--configfile", "short.yaml", timeout=480)  # the run, not the toy
    assert first.returncode == 0, f"{first.stdout[-4000:]}\n{first.stderr[-8000:]}"
    kept = {2: (run_dir / "eval" / "step_2.json").stat().st_mtime_ns}

    cfg["grid"]["train"].update(steps=6)  # checkpoints 4 and 6 are new
    write_config(wd / "long.yaml", cfg)
    proc = subprocess.Popen(
        [*SNAKEMAKE_ON_SLURM, *PROFILE, *evals, "--configfile", "long.yaml"],
        cwd=wd,
        env=JOB_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        cancelled = None
        while cancelled is None:  # the job of the segment up to step 6, once it runs
            assert proc.poll() is None and time.monotonic() < deadline, "the segment up to step 6 never ran"
            for line in run(["squeue", "-h", "-o", "%i %T %k"]).stdout.splitlines():
                job_id, state, comment = line.split(maxsplit=2)
                if comment.startswith("rule_train_") and comment.endswith("_6") and state == "RUNNING":
                    run(["scontrol", "suspend", job_id])  # freeze it mid-run, then take the allocation away
                    run(["scancel", job_id])
                    cancelled = job_id
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=480)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-6000:]
    assert "Trying to restart job" in out, out[-4000:]

    # Every segment resumed from the one before it (the first trained from scratch), the cancelled one's retry
    # from step 4 as well; the metrics hold every step once.
    attempts = []
    for log in sorted((wd / ".snakemake" / "slurm_logs" / "rule_train").glob("**/*.log"), key=lambda p: int(p.stem)):
        end = int(log.parent.name.rsplit("_", 1)[1])  # the plugin's folder per job: <model>_<method>_<seed>_<end>
        attempts.append((log.stem, end, re.findall(r"resumed from checkpoint step (\d+)", log.read_text())))
    assert [end for _, end, _ in attempts] == [2, 4, 6, 6], attempts
    for job_id, end, resumed in attempts:
        if job_id != cancelled:
            assert resumed == ([str(end - 2)] if end > 2 else []), attempts
    assert [job_id for job_id, _, _ in attempts].index(cancelled) == 2, attempts
    steps = [json.loads(line)["step"] for line in (run_dir / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7)), steps

    # Every checkpoint evaluated exactly once over both runs; the old results untouched.
    evaluated = sorted(
        int(m)
        for log in (wd / ".snakemake" / "slurm_logs" / "rule_evaluate").glob("**/*.log")
        for m in re.findall(r"^\s*wildcards: .*step=(\d+)", log.read_text(), re.M)[:1]
    )
    assert evaluated == [2, 4, 6], evaluated
    assert {2: (run_dir / "eval" / "step_2.json").stat().st_mtime_ns} == kept


# ------------------------------------------------------------------------------------- multi-node request
MULTINODE_SNAKEFILE = """\
# The request rule train makes for a paper run (calibrl.grid.request: the OpenRLHF backend's slurm_request of the
# run's layout, as workflow/rules/common.smk's train_request), submitted through the profile; in the allocation,
# ray_cluster.sh starts Ray on every node and the probe asks it for OpenRLHF's placement groups
# (calibrl.backends.openrlhf.layout.ray_requests).
import json

from calibrl import grid as G
from calibrl.backends.openrlhf import layout as L
from calibrl.config import validate


configfile: {paper!r}


validate(config)  # the schema's defaults filled in, as the workflow reads the config


def groups(run, layout):  # as the launcher places the run (calibrl.backends.openrlhf.command)
    return L.run_roles(layout, G.method(config, run.method))["ray_groups"]


RUN, DLC_RUN = G.Run("qwen3-14b", "grpo", 0), G.Run("qwen3-8b", "dapo_iac_dlc", 0)
LAYOUT = G.resources(config, RUN)
# Qwen3-14B's layout before the config check existed: actor 2x8, reference 4, vLLM 4 engines x TP2
OLD = {{**LAYOUT, "colocate_all": False, "actor_gpus_per_node": 8, "ref_gpus_per_node": 4, "vllm_engines": 4}}
LAYOUTS = {{
    "paper": {{"groups": groups(RUN, LAYOUT), "wait_s": 120}},
    "dlc_8b": {{"groups": groups(DLC_RUN, G.resources(config, DLC_RUN)), "wait_s": 120}},
    "old": {{"groups": groups(RUN, OLD), "wait_s": 10}},
}}


rule train:
    output:
        "ray.json",
    params:
        layouts=json.dumps(LAYOUTS),
        gpus=LAYOUT["gpus_per_node"],
    resources:
        **G.request(config, RUN),
    shell:
        "echo '{{params.layouts}}' > layouts.json; "
        "RAY_GPUS_PER_NODE={{params.gpus}} bash {script} {python} {probe} layouts.json {{output}}"
"""


def test_multi_node_layout_gets_its_nodes_gpus_and_ray_placement(local_slurm, tmp_path):
    """Qwen3-14B's layout in config/paper.yaml, 2 nodes x 8 GPUs: the request reaches sbatch through the
    profile (which sets no nodes or GPUs for rule train), SLURM allocates both nodes of partition gpu with 8
    GPUs each, ray_cluster.sh starts a head and a worker (one srun step per node), and Ray places OpenRLHF's
    colocated group of 16 bundles, 8 per node. In the same allocation the 8B DLC run's colocated group fits one
    node; the old 14B layout (28 GPUs) is never placed: its actor's group waits forever, as OpenRLHF would."""
    python = ray_python()
    shutil.copytree(REPO / "slurm", tmp_path / "slurm")
    script = REPO / "src" / "calibrl" / "gpu" / "ray_cluster.sh"
    probe = REPO / "tests" / "ray_placement_probe.py"
    snakefile = MULTINODE_SNAKEFILE.format(
        paper=str(REPO / "config" / "paper.yaml"), script=script, python=python, probe=probe
    )
    (tmp_path / "multinode.smk").write_text(snakefile)
    # the test cluster's partition and sizes in place of the real ones (no nodes or GPUs: those are the rule's)
    (tmp_path / "overlay.yaml").write_text(
        "default-resources: {slurm_partition: gpu, runtime: 10, mem_mb: 1000}\n"
        "set-resources: {train: {slurm_partition: gpu, cpus_per_task: 1, mem_mb: 2000, runtime: 10}}\n"
        "slurm-init-seconds-before-status-checks: 2\nslurm-keep-successful-logs: true\nlatency-wait: 5\n"
    )
    env = {
        **JOB_ENV,
        "RAY_BIN": str(python.parent / "ray"),
        "RAY_PYTHON": str(python),  # no RAY_PORT: the head's GCS picks a free port on its node
        "RAY_AUTH_DIR": str(tmp_path / "ray-auth"),
        "RAY_JOIN_TIMEOUT": "180",
        # a CPU per bundle: the stand-in nodes have this host's 2 cores, a GPU node has many (cpus_per_task)
        "RAY_CPUS_PER_NODE": "8",
    }
    overlay = str(tmp_path / "overlay.yaml")
    cmd = [*SNAKEMAKE_ON_SLURM, "--profile", "slurm", "--profile", overlay, "-s", "multinode.smk"]
    proc = run(cmd, cwd=tmp_path, timeout=420, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    ((job_id, log),) = submitted_jobs(output).items()
    show = run(["scontrol", "show", "job", job_id]).stdout
    if show:  # slurmctld forgets finished jobs after MinJobAge (300 s)
        assert "NumNodes=2" in show and "TresPerNode=gres:gpu:8" in show and "Partition=gpu" in show, show
    # the Ray head on the allocation's first node and a worker on the other, not the job step's node alone
    text = Path(log).read_text()
    assert re.search(r"ray_cluster.sh: head \S+ \(\S+\), 2 node\(s\), 8 GPU\(s\) per node", text), text[-3000:]
    # each node its own temp dir (both nodes are this host here), gone with the job; the head announces a loopback
    # address, allowed only because every node is on loopback (scripts/local_slurm.sh: NodeAddr=127.0.0.1)
    found = re.findall(r": Ray (head|worker) at (\S+), temp dir (\S+)", text)
    nodes = {role: (ip, temp) for role, ip, temp in found}
    assert nodes.keys() == {"head", "worker"} and nodes["head"][1] != nodes["worker"][1], text[-3000:]
    assert ipaddress.ip_address(nodes["head"][0]).is_loopback
    assert not any(Path(temp).parent.exists() for _, temp in nodes.values())

    out = json.loads((tmp_path / "ray.json").read_text())
    assert out["ray_nodes"] == [{"GPU": 8.0, "CPU": 8.0}] * 2, out["ray_nodes"]
    placed = out["placed"]
    assert placed["paper"] == {"actor, reference, vLLM (colocated)": [8, 8]}, placed
    assert placed["dlc_8b"] == {"actor, reference, vLLM (colocated)": [8]}, placed  # the memory's ranks inside
    assert placed["old"] == {"vLLM": [8], "actor": None}, placed  # 8 of 16 GPUs left for an actor of 16


# ------------------------------------------------------------------------------------------ Ray steps' CPUs
RAY_CLUSTER = REPO / "src" / "calibrl" / "gpu" / "ray_cluster.sh"
RAY_PROBE = REPO / "src" / "calibrl" / "preflight" / "ray_probe.py"  # run as a file: the Ray venv has no calibrl
# ray_cluster.sh's COMMAND: a GPU actor (as OpenRLHF's roles) reports the CPUs it may run on and what its SLURM step
# was given, then the preflight's Ray probe runs (one node, one GPU: its CPU check, no all-reduce).
AFFINITY = r"""
import json, os, subprocess, sys

import ray

ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)


@ray.remote(num_gpus=1, num_cpus=1)
class Where:
    def report(self):
        env = os.environ
        return {"cpus": sorted(os.sched_getaffinity(0)), "node": env.get("SLURMD_NODENAME"),
                "cpus_per_task": env.get("SLURM_CPUS_PER_TASK"), "step_cpus": env.get("SLURM_CPUS_ON_NODE")}


out = {"actor": ray.get(Where.remote().report.remote(), timeout=300), "driver": sorted(os.sched_getaffinity(0))}
ray.shutdown()
probe = subprocess.run([sys.executable, sys.argv[2], "1", "1"], capture_output=True, text=True, timeout=600)
out["probe"] = {"rc": probe.returncode, "out": probe.stdout, "err": probe.stderr[-4000:]}
json.dump(out, open(sys.argv[1], "w"))
"""


def ray_job_on_the_whole_node(tmp_path: Path, name: str, *command: str, **extra_env: str) -> tuple[int, str, int]:
    """ray_cluster.sh run as the SLURM executor runs a rule, in its `srun -n1 --cpus-per-task=N` step, inside a
    job of all N CPUs of partition cpu's node and one stand-in GPU: the job's exit status, its log, and N."""
    cpus = int(run(["sinfo", "-h", "-p", "cpu", "-o", "%c"]).stdout.split()[0])
    if cpus < 2 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a node of 2 CPUs or more: one CPU is all a pinned step gets anyway")
    python = ray_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "RAY_"))}
    env.update(RAY_BIN=str(python.parent / "ray"), RAY_PYTHON=str(python), RAY_GPUS_PER_NODE="1",
               RAY_AUTH_DIR=str(tmp_path / f"ray-auth-{name}"), RAY_JOIN_TIMEOUT="180", **extra_env)  # fmt: skip
    step = ["srun", "-n1", "--cpu-bind=q", f"--cpus-per-task={cpus}", "--nodes=1"]  # the plugin's wrapper
    wrap = " ".join(map(shlex.quote, [*step, "bash", str(RAY_CLUSTER), str(python), *command]))
    log = tmp_path / f"{name}.log"
    sbatch = ["sbatch", "--wait", "-p", "cpu", "--gres=gpu:1", f"--cpus-per-task={cpus}", "--mem=3000", "-t", "10"]
    proc = run([*sbatch, "-o", str(log), "--wrap", wrap], timeout=480, env=env)
    text = log.read_text(errors="replace") if log.exists() else ""
    return proc.returncode, f"{proc.stdout}\n{proc.stderr}\n{text}", cpus


def test_ray_steps_get_all_the_jobs_cpus_on_their_node(local_slurm, tmp_path):
    """The local SLURM binds tasks to cores (scripts/local_slurm.sh: task/affinity, TaskPluginParam=Cores), as
    clusters that bind or fence tasks do. A job of all N CPUs of a node runs ray_cluster.sh inside the executor's
    step: the Ray step is given the job's N CPUs (--cpus-per-task, read from the controller) and not pinned inside
    them (--cpu-bind=none), so a GPU actor may run on all N; without that it ran on one core (srun's default of one
    CPU per task, Slurm >= 22.05), with raylet, every other actor, the vLLM engines and the grading pools. The
    preflight's Ray probe passes and says so; with the Ray step pinned to one core (RAY_SRUN_ARGS, which overrides
    the script's options) it fails, naming what it saw and the fix."""
    conf = run(["scontrol", "show", "config"]).stdout
    binds = re.search(r"^TaskPlugin\s*=.*task/affinity", conf, re.M) and re.search(
        r"^TaskPluginParam\s*=.*\bcores\b", conf, re.M | re.I
    )
    assert binds, "the local SLURM does not bind tasks to cores (an older config?): local_slurm.sh stop --force; start"
    (tmp_path / "affinity.py").write_text(AFFINITY)
    result = tmp_path / "result.json"
    rc, log, cpus = ray_job_on_the_whole_node(
        tmp_path, "whole", str(tmp_path / "affinity.py"), str(result), str(RAY_PROBE)
    )
    assert rc == 0 and result.exists(), log[-6000:]
    out = json.loads(result.read_text())
    actor = out["actor"]
    assert len(actor["cpus"]) >= cpus, (out, log[-3000:])  # one core before the fix
    assert actor["cpus_per_task"] == str(cpus) and actor["node"] == socket.gethostname().split(".")[0], actor
    assert len(out["driver"]) == cpus  # the executor's own step: its N cores
    probe = out["probe"]
    assert probe["rc"] == 0, probe
    assert f"; one GPU: no all-reduce to run; each GPU actor may run on {len(actor['cpus'])} CPU(s)" in probe["out"]
    assert f"(the job has {cpus} on its node)" in probe["out"], probe

    # the Ray step pinned to one core: the probe fails, naming it
    rc, log, _ = ray_job_on_the_whole_node(
        tmp_path, "pinned", str(RAY_PROBE), "1", "1", RAY_SRUN_ARGS="--gres=gpu:1 --cpus-per-task=1 --cpu-bind=cores"
    )
    assert rc != 0, log[-4000:]
    assert f"a GPU actor on {socket.gethostname().split('.')[0]} may run on 1 CPU(s)" in log, log[-4000:]
    assert f"the job has {cpus} there" in log and "RAY_SRUN_ARGS" in log and "--cpu-bind=none" in log, log[-4000:]
