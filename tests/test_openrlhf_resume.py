"""Finding 2 of issue 25: what a job killed mid-save leaves in OpenRLHF's checkpoint folder, and the repair that
lets the next segment resume (``calibrl.backends.openrlhf.resume``). The folders are laid out as OpenRLHF 0.11.2
and DeepSpeed write them, in their order (tags, ``latest``, ``metric.json``; the Hugging Face copy after, with
``tokenizer.json`` last); each test stops that order where a kill would."""

from __future__ import annotations

from pathlib import Path

from calibrl.backends.openrlhf import launch, resume


def ds_save(ckpt: Path, step: int, finished: bool = True, latest: bool = True) -> None:
    """``strategy.save_ckpt``: DeepSpeed's tag folder, ``latest`` once written, then OpenRLHF's ``metric.json``."""
    tag = ckpt / "_actor" / f"global_step{step}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"")
    if latest:
        (ckpt / "_actor" / "latest").write_text(f"global_step{step}")
    if finished:
        (tag / "metric.json").write_text('{"metric_key": null, "metric_value": null}')


def hf_save(ckpt: Path, step: int, finished: bool = True) -> None:
    """``strategy.save_model``: config, weights, tokenizer config, and ``tokenizer.json`` last."""
    path = ckpt / f"global_step{step}_hf"
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (path / name).write_text("{}")
    if finished:
        (path / "tokenizer.json").write_text("{}")


def memory_save(ckpt: Path, step: int) -> None:
    (ckpt / "dlc_memory" / f"global_step{step}").mkdir(parents=True)


def saved(ckpt: Path, *steps: int) -> None:
    for step in steps:
        memory_save(ckpt, step)  # DLC's memory first (in train_step), then fit's save of the policy
        ds_save(ckpt, step)
        hf_save(ckpt, step)


def layout(ckpt: Path) -> list[str]:
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.glob("*/*") if p.is_dir() or p.name == "latest") + sorted(
        p.name for p in ckpt.glob("*_hf")
    )


def test_killed_between_the_deepspeed_state_and_its_hugging_face_copy(tmp_path):
    """``latest`` names step 4, whose copy lacks ``tokenizer.json``: OpenRLHF would resume at 4 and never save it
    again. The repair rewinds to step 2 (its DeepSpeed state and memory are kept), so step 4 is trained again."""
    ckpt, markers = tmp_path / "openrlhf", tmp_path / "markers"
    markers.mkdir()
    saved(ckpt, 2)
    memory_save(ckpt, 4)
    ds_save(ckpt, 4)
    hf_save(ckpt, 4, finished=False)
    assert resume.resume_step(ckpt, markers, 2) == 2
    done = resume.repair(ckpt, markers, 2)
    assert any("global_step4_hf" in d for d in done) and "_actor/latest -> global_step2" in done
    assert (ckpt / "_actor" / "latest").read_text() == "global_step2"
    assert layout(ckpt) == ["_actor/global_step2", "_actor/latest", "dlc_memory/global_step2", "global_step2_hf"]
    assert resume.repair(ckpt, markers, 2) == []  # idempotent
    assert launch.write_markers(ckpt, markers, 2, 4) == [2]  # step 4 is to be trained, not marked


def test_killed_inside_the_deepspeed_save(tmp_path):
    """A tag without ``metric.json`` and ``latest`` still at the previous step: the partial tag goes (OpenRLHF's
    rotation would otherwise count it and delete the complete one before saving again)."""
    ckpt = tmp_path / "openrlhf"
    saved(ckpt, 2, 4)
    ds_save(ckpt, 6, finished=False, latest=False)
    done = resume.repair(ckpt, tmp_path, 2)
    assert done == ["removed global_step6 (an incomplete save)"]
    assert (ckpt / "_actor" / "latest").read_text() == "global_step4"


def test_a_copy_removed_after_its_evaluation_is_a_resume_point(tmp_path):
    """grid.retention removes an evaluated Hugging Face copy; its marker says it was complete."""
    ckpt, markers = tmp_path / "openrlhf", tmp_path / "markers"
    markers.mkdir()
    saved(ckpt, 2, 4)
    (markers / "step_4.done").write_text("{}")
    for path in (ckpt / "global_step4_hf").iterdir():
        path.unlink()
    (ckpt / "global_step4_hf").rmdir()
    assert resume.resume_step(ckpt, markers, 2) == 4 and resume.repair(ckpt, markers, 2) == []


def test_no_complete_state_starts_from_scratch(tmp_path):
    """``_actor`` without a complete tag (killed in the first save): OpenRLHF's fit would fail with
    ``KeyError: 'episode'``; the folder goes and the run starts from the initial model."""
    ckpt = tmp_path / "openrlhf"
    memory_save(ckpt, 2)
    ds_save(ckpt, 2, finished=False, latest=False)
    done = resume.repair(ckpt, tmp_path, 2)
    assert not (ckpt / "_actor").exists() and not (ckpt / "dlc_memory" / "global_step2").exists()
    assert done[-1] == "removed _actor (no complete DeepSpeed state: training starts from scratch)"
    assert resume.repair(tmp_path / "nothing", tmp_path, 2) == []  # a fresh run


def test_a_state_saved_for_resuming_only_is_a_resume_point(tmp_path):
    """A layout's ds_save_steps (1 here, evaluated every 2): step 3's DeepSpeed tag has no Hugging Face copy by design
    (``save_cadence``) and is where a job killed in step 4 resumes; step 4, an evaluated step, still needs its copy."""
    ckpt, markers = tmp_path / "openrlhf", tmp_path / "markers"
    markers.mkdir()
    saved(ckpt, 2)
    memory_save(ckpt, 3)
    ds_save(ckpt, 3)
    assert resume.resume_step(ckpt, markers, 2) == 3 and resume.repair(ckpt, markers, 2) == []
    memory_save(ckpt, 4)
    ds_save(ckpt, 4)  # killed before the copy of an evaluated step: back to 3
    assert resume.resume_step(ckpt, markers, 2) == 3
    assert "_actor/latest -> global_step3" in resume.repair(ckpt, markers, 2)
    assert resume.resume_step(ckpt, markers, 1) == 2  # every step evaluated: 3 and 4 wait for copies


def test_the_save_cadence_patch_skips_the_copies_between_evaluated_steps(tmp_path):
    """The wrapper on OpenRLHF's DeepspeedStrategy.save_model (the real class) writes global_step{k}_hf at the
    multiples of eval_every only, and anything else it is asked to save."""
    from calibrl.backends.openrlhf import save_cadence

    calls = []

    class Strategy:  # DeepspeedStrategy.save_model's signature, as the target pins it
        def save_model(self, model, tokenizer, output_dir, **kwargs):
            calls.append(Path(output_dir).name)

    module = type(save_cadence)("fake")
    module.DeepspeedStrategy = Strategy
    save_cadence.SAVE_MODEL.check()  # the real one has the pinned parameters
    save_cadence.patch(module, eval_every=50)
    for name in ("global_step10_hf", "global_step50_hf", "global_step60_hf", "global_step100_hf", "final"):
        Strategy().save_model(None, None, str(tmp_path / name))
    assert calls == ["global_step50_hf", "global_step100_hf", "final"]
