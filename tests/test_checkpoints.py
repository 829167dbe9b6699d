"""The run folder's rules (calibrl.checkpoints, calibrl.grid, calibrl.runs): one writer, checkpoints stamped with
the settings that made them, and markers that carry that stamp to evaluation."""

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import filled

from calibrl import checkpoints
from calibrl import grid as G
from calibrl.checkpoints import RunStamp, changed_keys, fingerprint
from calibrl.io import write_json
from calibrl.runs import marker_of
from calibrl.spec import MethodSpec

CONFIG = filled("config")


def test_run_path_and_its_inverse():
    run = G.Run("qwen3-tiny-m", "iac_a0.5", 12)
    assert run.path == "qwen3-tiny-m/iac_a0.5/s12"
    for path in (
        f"results/runs/{run.path}/eval/step_25.json",
        f"/abs/results/paper/runs/{run.path}/metrics.jsonl",
        f"runs/{run.path}",
        run.path,
    ):
        assert G.Run.from_path(path) == run, path
    with pytest.raises(ValueError, match="not inside a run folder"):
        G.Run.from_path("results/tables/table2.md")


def test_each_job_reads_only_its_slice():
    run = G.Run("qwen3-tiny-m", "iac", 0)
    base = G.train_params(CONFIG, run)
    changed = json.loads(json.dumps(CONFIG))
    changed["grid"]["methods"]["iac_a2"]["iac_alpha"] = 3.0  # another method's alpha
    changed["grid"]["tables"]["table5"] = ["grpo"]
    changed["grid"]["eval"]["n"] = 4
    changed["grid"]["workers"] = 2
    assert G.train_params(changed, run) == base
    assert G.warmstart_params(changed, "qwen3-tiny-m", 1) == G.warmstart_params(CONFIG, "qwen3-tiny-m", 1)
    assert G.eval_params(changed) != G.eval_params(CONFIG)  # n is the evaluation's own
    changed["grid"]["train"]["lr"] = 1e-3
    assert fingerprint(G.train_params(changed, run)) != fingerprint(base)
    assert G.eval_params(changed) == G.eval_params({"grid": {**changed["grid"], "train": CONFIG["grid"]["train"]}})
    assert G.warmstart_params(changed, "qwen3-tiny-m", 1) == G.warmstart_params(CONFIG, "qwen3-tiny-m", 1)
    assert changed_keys(base, G.train_params(changed, run)) == ["train.lr"]
    # a DAPO-only setting reruns the DAPO runs alone: a method's spec holds only what applies to it
    dapo_only = json.loads(json.dumps(CONFIG))
    dapo_only["grid"]["train"]["dapo_clip_high"] = 0.3
    assert G.train_params(dapo_only, run) == base
    dapo = G.Run("qwen3-tiny-m", "dapo", 0)
    assert changed_keys(G.train_params(CONFIG, dapo), G.train_params(dapo_only, dapo)) == ["method.clip_high"]
    # DLC's memory model belongs to the runs that use it only
    assert G.train_params(CONFIG, G.Run("qwen3-tiny-m", "dapo_iac_dlc", 0))["memory"]["name"] == "qwen3-tiny-xs"
    assert base["memory"] is None


def test_a_longer_cpu_run_keeps_its_identity_an_openrlhf_one_does_not():
    """The CPU trainer's first k steps do not depend on the run's length, so extending a run resumes it;
    OpenRLHF sizes its prompt stream (episodes, max_samples) from the step count, so there it is identity."""
    run = G.Run("qwen3-tiny-m", "grpo", 0)
    longer = json.loads(json.dumps(CONFIG))
    longer["grid"]["train"]["steps"] *= 2
    assert G.train_params(longer, run) == G.train_params(CONFIG, run)
    assert "steps" not in G.train_params(CONFIG, run)["train"]
    # one training job per checkpoint: the longer run keeps the shorter one's segments and adds its new ones
    short = G.segment_ends(CONFIG, run)
    assert short == G.eval_steps(CONFIG) and G.segment_ends(longer, run)[: len(short)] == short
    assert G.segment_ends(longer, run)[-1] == 2 * CONFIG["grid"]["train"]["steps"]
    paper = {"grid": {**CONFIG["grid"], "trainer": "openrlhf"}}
    paper_longer = {"grid": {**longer["grid"], "trainer": "openrlhf"}}
    assert changed_keys(G.train_params(paper, run), G.train_params(paper_longer, run)) == ["train.steps"]


def test_fingerprint_is_stable_and_ignores_key_order():
    a = {"train": {"lr": 0.001, "steps": 100}, "seed": 0}
    b = {"seed": 0, "train": {"steps": 100, "lr": 1e-3}}
    assert fingerprint(a) == fingerprint(b) and len(fingerprint(a)) == 16
    assert fingerprint({**a, "seed": 1}) != fingerprint(a)


# ------------------------------------------------------------------------------------------- the typed stamp
def _old_stamp(settings: dict, inputs: dict, paths: dict | None = None, resources: dict | None = None) -> dict:
    """settings.json's content as calibrl.checkpoints made it before the stamp had a type (its fingerprint and stamp
    functions, verbatim): the typed stamp must write these bytes, or every run would retrain."""
    identity = {"settings": settings, "inputs": inputs}
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return {"fingerprint": hashlib.sha256(text.encode()).hexdigest()[:16], **identity, "paths": paths or {},
            "resources": resources}  # fmt: skip


SHIPPED = ["config", "paper", "rehearsal", "cluster_smoke"]  # config/*.yaml that are whole configs
IDENTITIES = Path(__file__).parent / "data" / "paper_identities.json"


def test_a_new_version_keeps_the_identity_of_every_paper_run():
    """A site that upgrades must not retrain its finished paper runs: the fingerprint of each config/paper.yaml run's
    settings is the one the last release gave it (tests/data/paper_identities.json). A change that alters what the
    runs compute changes it on purpose: the file is updated in the same commit, and CHANGELOG.md says that the runs
    retrain."""
    config = filled("paper")
    got = {run.path: fingerprint(G.train_params(config, run)) for run in G.runs(config)}
    assert got == json.loads(IDENTITIES.read_text())


def test_a_switch_added_later_is_in_a_runs_identity_only_where_it_is_on():
    config = filled("config")
    spec = G.method(config, "grpo")
    assert "shuffle_rewards" not in spec.to_dict() and MethodSpec.from_dict(spec.to_dict()) == spec
    control = dataclasses.replace(spec, shuffle_rewards=True)
    assert control.to_dict()["shuffle_rewards"] is True and MethodSpec.from_dict(control.to_dict()) == control


@pytest.mark.parametrize("name", SHIPPED)
def test_the_typed_stamp_writes_every_shipped_runs_settings_file_byte_for_byte(name, tmp_path):
    """Rerun identity: for every run of every shipped config, RunStamp writes the settings.json the untyped stamp
    wrote (same bytes, same fingerprint), and reading it back gives the same stamp and the same bytes again."""
    config = filled(name)
    for run in G.runs(config):
        settings, resources = G.train_params(config, run), G.resources(config, run)
        inputs = G.inputs(config, run)
        digests = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in inputs.items()}
        paths = {k: f"/abs/{v}" for k, v in inputs.items()}
        old, new = tmp_path / "old.json", tmp_path / "new.json"
        write_json(old, _old_stamp(settings, digests, paths, resources))
        stamp = RunStamp.build(settings, digests, paths, resources)
        stamp.write(new)
        assert new.read_bytes() == old.read_bytes(), run
        assert (
            stamp.fingerprint
            == json.loads(old.read_text())["fingerprint"]
            == fingerprint({"settings": settings, "inputs": digests})
        )
        assert checkpoints.stamp(settings, digests, paths, resources) == json.loads(old.read_text())
        back = RunStamp.read(old)
        assert back == stamp and back.path == old.resolve() and back.method == G.method(config, run.method)
        back.write(new)
        assert new.read_bytes() == old.read_bytes(), run


def test_the_fingerprint_of_a_given_stamp_never_changes():
    """The hash itself is pinned (computed by the untyped code): a change to it retrains every run everywhere."""
    settings = {"run": "qwen3-8b/iac/s3", "backend": "openrlhf", "seed": 3, "memory": None,
                "method": {"iac_alpha": 1.0, "dlc_mu": 0.5}, "template": "{problem}\n√",
                "train": {"lr": 1e-6, "steps": 2000, "clip": [0.2, 0.28]}}  # fmt: skip
    inputs = {"train": "ab12", "init": None}
    stamp = RunStamp.build(settings, inputs, {"train": "/data/train.jsonl"}, {"nodes": 2})
    assert stamp.fingerprint == _old_stamp(settings, inputs)["fingerprint"] == "fca715a71ba89b36"


def test_settings_job_writes_what_it_always_wrote(tmp_path):
    """Rule run_settings' job, on real files: the bytes the untyped stamp gave for the same digests and paths."""
    config = filled("config")
    run = G.runs(config)[0]
    (tmp_path / "train.jsonl").write_text('{"id": "q0"}\n')
    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "config.json").write_text("{}")
    (tmp_path / "init.json").write_text(json.dumps({"path": str(tmp_path / "init")}))
    inputs = {"train": str(tmp_path / "train.jsonl"), "init": str(tmp_path / "init.json")}
    out = tmp_path / "run" / "settings.json"
    checkpoints.settings_job(G.train_params(config, run), G.resources(config, run), str(out), inputs)
    paths = {"train": str(tmp_path / "train.jsonl"), "init": str(tmp_path / "init"), "init_info": inputs["init"]}
    digests = {"train": checkpoints.digest(paths["train"]), "init": checkpoints.digest(paths["init"])}
    old = _old_stamp(G.train_params(config, run), digests, paths, G.resources(config, run))
    write_json(tmp_path / "old.json", old)
    assert out.read_bytes() == (tmp_path / "old.json").read_bytes()
    stamp = RunStamp.read(out)
    assert stamp.fingerprint == old["fingerprint"] and stamp.run == run.path and stamp.run_dir == out.parent.resolve()
    assert stamp.train_settings(steps=7).steps == 7 and stamp.method == G.method(config, run.method)


def test_a_stamp_is_read_once_per_process_and_file_version_and_is_read_only(tmp_path):
    path = tmp_path / "settings.json"
    RunStamp.build({"run": "m/grpo/s0", "seed": 0, "train": {"lr": [0.1]}}, {}).write(path)
    first = RunStamp.read(path)
    assert RunStamp.read(str(path)) is first and RunStamp.read(tmp_path / "." / "settings.json") is first
    assert first.resources is None and first.paths == {}  # a hand-made stamp: no layout, no input files
    with pytest.raises(ValueError, match="settings.json: no compiled method"):
        assert first.method  # parsed only where a reader asks for it
    with pytest.raises(TypeError, match="read-only"):
        first.settings["seed"] = 1
    with pytest.raises(TypeError, match="read-only"):
        first.train["lr"].append(0.2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.fingerprint = "x"
    copy = first.to_dict()
    copy["settings"]["seed"] = 1  # a copy is plain and the caller's
    assert first.seed == 0 and json.loads(json.dumps(first.settings)) == first.to_dict()["settings"]
    RunStamp.build({"run": "m/grpo/s0", "seed": 1}, {}).write(path)  # rewritten (rule run_settings reran)
    again = RunStamp.read(path)
    assert again is not first and again.seed == 1 and again.fingerprint != first.fingerprint
    with pytest.raises(ValueError, match="not a run's settings.json.*no 'inputs'"):
        RunStamp.from_dict({"fingerprint": "x", "settings": {}})
    assert RunStamp.from_env({}) is None
    assert RunStamp.from_env({checkpoints.SETTINGS_ENV: str(path)}) is again


def test_claim_keeps_matching_checkpoints_and_sets_aside_others(tmp_path, caplog):
    run = tmp_path / "run"
    settings = {"train": {"lr": 0.1}, "seed": 0}
    first = checkpoints.stamp(settings, {"train": "abc"})
    (run / "ckpt").mkdir(parents=True)  # Snakemake makes the markers' folder before the job starts
    assert checkpoints.claim(run, first) is False  # nothing to resume yet
    assert not (run / "stale").exists()
    (run / "ckpt" / "step_2").mkdir()
    (run / "ckpt" / "step_2" / "trainer_state.pt").write_bytes(b"state")
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "eval").mkdir()
    (run / "eval" / "step_2.json").write_text("{}")
    (run / "settings.json").write_text(json.dumps(first))
    assert checkpoints.claim(run, checkpoints.stamp(settings, {"train": "abc"})) is True
    assert (run / "ckpt" / "step_2").is_dir()
    old = first["fingerprint"]
    with caplog.at_level("WARNING"):
        assert checkpoints.claim(run, checkpoints.stamp({**settings, "train": {"lr": 0.2}}, {"train": "abc"})) is False
    assert "settings changed: train.lr" in caplog.text
    assert (run / "stale" / old / "ckpt" / "step_2").is_dir() and (run / "stale" / old / "metrics.jsonl").exists()
    assert not (run / "ckpt" / "step_2").exists() and not (run / "metrics.jsonl").exists()
    assert (run / "eval" / "step_2.json").exists() and (run / "settings.json").exists()  # Snakemake's files stay
    stamp = json.loads((run / "ckpt" / checkpoints.STAMP).read_text())
    assert stamp["settings"]["train"]["lr"] == 0.2
    # a changed input (new data, another warm start) counts as much as a changed setting
    (run / "ckpt" / "step_2").mkdir()
    (run / "ckpt" / "step_2" / "trainer_state.pt").write_bytes(b"state")
    with caplog.at_level("WARNING"):
        assert checkpoints.claim(run, checkpoints.stamp({**settings, "train": {"lr": 0.2}}, {"train": "xyz"})) is False
    assert "input train" in caplog.text


def test_unstamped_checkpoints_are_never_resumed(tmp_path):
    run = tmp_path / "run"
    (run / "ckpt" / "step_2").mkdir(parents=True)  # an older version's checkpoint: no stamp
    (run / "ckpt" / "step_2" / "trainer_state.pt").write_bytes(b"state")
    assert checkpoints.claim(run, checkpoints.stamp({"a": 1}, {})) is False
    assert (run / "stale" / "unstamped" / "ckpt" / "step_2").is_dir()


def test_markers_carry_the_stamp_and_evaluation_checks_it(tmp_path):
    run = tmp_path / "run"
    stamp = checkpoints.stamp({"a": 1}, {})
    checkpoints.claim(run, stamp)
    policy = run / "ckpt" / "step_2" / "policy"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text("{}")
    marker = run / "ckpt" / "step_2.done"
    checkpoints.write_marker(marker, 2, policy)
    content = checkpoints.check_marker(marker, stamp["fingerprint"])
    assert content["step"] == 2 and content["policy"] == str(policy.resolve())
    assert marker.stat().st_mtime == (policy / "config.json").stat().st_mtime  # dated to the checkpoint
    with pytest.raises(checkpoints.StaleCheckpoint, match="trained with settings"):
        checkpoints.check_marker(marker, checkpoints.stamp({"a": 2}, {})["fingerprint"])


def test_a_rewritten_unchanged_settings_file_keeps_the_date_of_its_stamp(tmp_path):
    """run_settings rerun with the same content (a forced upstream rule) must not leave settings.json newer than
    the resumed run's backdated markers, or Snakemake would plan the training on every invocation."""
    run = tmp_path / "run"
    stamp = checkpoints.stamp({"a": 1}, {})
    checkpoints.claim(run, stamp)
    first = (run / "ckpt" / checkpoints.STAMP).stat().st_mtime
    os.utime(run / "ckpt" / checkpoints.STAMP, (first - 100, first - 100))
    settings = run / "settings.json"
    settings.write_text(json.dumps(stamp))
    checkpoints.date_settings(settings)
    assert settings.stat().st_mtime == first - 100
    other = checkpoints.stamp({"a": 2}, {})  # new settings: a new file, dated now, so training reruns
    settings.write_text(json.dumps(other))
    before = settings.stat().st_mtime
    checkpoints.date_settings(settings)
    assert settings.stat().st_mtime == before


HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from calibrl.checkpoints import run_lock
    with run_lock(sys.argv[1]):
        Path(sys.argv[2]).write_text("held")
        time.sleep(600)
    """
)


def test_two_trainers_never_write_one_run(tmp_path):
    run, held = tmp_path / "run", tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run), str(held)])
    try:
        while not held.exists():  # event: the holder has the lock
            assert holder.poll() is None, "the holder died"
        second = subprocess.run(
            [sys.executable, "-c", HOLD, str(run), str(tmp_path / "never")], capture_output=True, text=True
        )
        assert second.returncode != 0 and not (tmp_path / "never").exists()
        assert "RunLocked" in second.stderr and f"pid {holder.pid}" in second.stderr, second.stderr[-2000:]
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # a dead holder: its lock dies with it
        holder.wait()
    taken = tmp_path / "taken"
    code = HOLD.replace("time.sleep(600)", "pass")
    after = subprocess.run([sys.executable, "-c", code, str(run), str(taken)], capture_output=True, text=True)
    assert after.returncode == 0 and taken.exists(), after.stderr[-2000:]
    assert f"took over the lock of pid {holder.pid}" in after.stderr, after.stderr[-2000:]


def test_evaluated_checkpoints_are_removed_unless_newest_or_kept(tmp_path):
    """grid.retention at paper scale: once its result is written, an OpenRLHF checkpoint (global_step{k}_hf) is
    removed unless it is the run's newest or listed; its marker stays, so training counts the step as done;
    evaluating it again says what happened and what to do."""
    from calibrl.backends import get
    from calibrl.backends.openrlhf.launch import write_markers
    from calibrl.data.records import write_jsonl
    from calibrl.evaluate import evaluate_job
    from calibrl.models import build_model, build_tokenizer, save

    tok = build_tokenizer()
    ckpt = tmp_path / "ckpt" / "openrlhf"
    for step in (2, 4, 6, 8):
        save(
            build_model(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=16),
            tok,
            ckpt / f"global_step{step}_hf",
        )
    stamp = checkpoints.stamp({"run": "m/grpo/s0", "seed": 0}, {})
    (tmp_path / "settings.json").write_text(json.dumps(stamp))
    (tmp_path / "ckpt" / checkpoints.STAMP).write_text(json.dumps(stamp))
    assert write_markers(ckpt, tmp_path / "ckpt", 2, 8) == [2, 4, 6, 8]
    write_jsonl(tmp_path / "test.jsonl", [{"id": "a", "problem": "1 + 1", "answer": "2", "source": "test"}])
    params = G.eval_params({"grid": {**CONFIG["grid"], "eval": {**CONFIG["grid"]["eval"], "n": 2, "k": 2}}})
    keep = {"remove_evaluated": True, "keep_steps": [4]}
    backend = get("openrlhf")

    def evaluate(*steps):
        markers = [str(tmp_path / "ckpt" / f"step_{s}.done") for s in steps]
        outs = [str(tmp_path / "eval" / f"step_{s}.json") for s in steps]
        evaluate_job(
            params,
            str(tmp_path / "settings.json"),
            markers,
            {"test": str(tmp_path / "test.jsonl")},
            outs,
            list(steps),
            workers=0,
            # as scripts/evaluate.py wires grid.retention to the run's backend
            release=(lambda policy, step: backend.gpu.release(policy, step, keep["keep_steps"]))
            if keep["remove_evaluated"]
            else None,
        )

    evaluate(2, 4, 8)
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step4_hf", "global_step6_hf", "global_step8_hf"]
    assert all((tmp_path / "eval" / f"step_{s}.json").exists() for s in (2, 4, 8))
    assert write_markers(ckpt, tmp_path / "ckpt", 2, 8) == [2, 4, 6, 8]  # a resumed segment: nothing missing
    with pytest.raises(FileNotFoundError, match="removed after its evaluation.*keep_steps"):
        evaluate(2)
    evaluate(6)  # not the newest any more: removed too
    assert not (ckpt / "global_step6_hf").exists()
    keep["remove_evaluated"] = False
    evaluate(8)
    assert (ckpt / "global_step8_hf").exists()


def test_an_evaluation_names_its_checkpoints_marker():
    assert marker_of("res/runs/m/grpo/s0/eval/step_50.json") == "res/runs/m/grpo/s0/ckpt/step_50.done"
    with pytest.raises(ValueError, match="not an evaluation file"):
        marker_of("res/runs/m/grpo/s0/metrics.jsonl")
    # the CPU backend's checkpoints stay: they are small and resumed from (no GPU side, hence nothing released)
    assert G.backend(CONFIG).gpu is None
