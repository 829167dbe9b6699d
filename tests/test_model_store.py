"""Hub models downloaded once on the login node (rule download_model, ``calibrl.model_store``) and read by
absolute path: the offline error, a pre-seeded folder, and the path the rules and jobs are wired to.

Nothing is fetched from the Hub here: huggingface_hub runs in its own offline mode."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import filled

from calibrl import grid as G
from calibrl.model_store import ModelNotAvailable, ModelNotLocked, download, verify, verify_info

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())  # as written: what the config check reads
PAPER = filled(RAW)


@pytest.fixture
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_offline_download_fails_naming_the_folder_to_pre_seed(offline, tmp_path):
    target = tmp_path / "models" / "Qwen--Qwen3-8B" / "abc123"
    with pytest.raises(ModelNotAvailable) as err:
        download("Qwen/Qwen3-8B", "abc123", target, tmp_path / "hub.json", tmp_path / "models.lock.yaml")
    text = str(err.value)
    assert str(target) in text and "login node" in text and "HF_HUB_OFFLINE is set" in text
    assert f"huggingface-cli download Qwen/Qwen3-8B --revision abc123 --local-dir {target}" in text
    assert f"head -n1 {target}/.cache/huggingface/download/config.json.metadata > {target}/.complete" in text
    assert not (tmp_path / "hub.json").exists() and not (target / ".complete").exists()
    assert not (tmp_path / "models.lock.yaml").exists()


SHA, OTHER = "0123abcd" * 5, "fedcba98" * 5


def seeded(tmp_path, commit: str = SHA) -> Path:
    """A finished download of a tiny model, as the pre-seed instructions leave it (its commit in .complete)."""
    from calibrl.models import build_model, build_tokenizer, save

    target = tmp_path / "m" / "main"
    tok = build_tokenizer()
    save(build_model(tok), tok, target)
    (target / ".complete").write_text(f"{commit}\n")
    return target


def test_a_pre_seeded_folder_is_used_as_it_is_and_locked(offline, tmp_path):
    target, lock = seeded(tmp_path), tmp_path / "models.lock.yaml"
    info = download("org/tiny", None, target, tmp_path / "hub.json", lock)
    assert json.loads((tmp_path / "hub.json").read_text()) == info
    assert info["path"] == str(target.resolve()) and info["resolved_revision"] == SHA and info["revision"] == "main"
    assert "config.json" in info["files"] and "model.safetensors" in info["files"]
    assert yaml.safe_load(lock.read_text()) == {"org/tiny@main": SHA}  # the first download locks main's commit
    assert verify_info(tmp_path / "hub.json") == SHA  # what every job checks before it reads the model
    (target / "config.json").unlink()  # a folder that is not a model is refused, by name
    with pytest.raises(ModelNotAvailable, match="no config.json"):
        download("org/tiny", None, target, tmp_path / "hub.json", lock)


def test_the_lock_holds_a_model_at_its_first_commit(offline, tmp_path):
    """main moved on, and the folder was replaced by a download of the new commit (another user, a re-download):
    the download rule and every job refuse it, naming both commits; a new line in the lock is a new model."""
    lock = tmp_path / "models.lock.yaml"
    lock.write_text(f"org/tiny@main: {SHA}\n")
    target = seeded(tmp_path, OTHER)
    with pytest.raises(ModelNotLocked, match=f"at commit {OTHER}, the lock file .* says {SHA}"):
        download("org/tiny", None, target, tmp_path / "hub.json", lock)
    with pytest.raises(ModelNotLocked, match="another download replaced it"):
        verify(target, "org/tiny", "main", lock)
    with pytest.raises(ModelNotLocked, match="not in the lock file"):
        verify(target, "org/tiny", "v2", lock)
    download("org/tiny", "v2", target, tmp_path / "hub.json", lock)  # another revision: its own line
    assert yaml.safe_load(lock.read_text()) == {"org/tiny@main": SHA, "org/tiny@v2": OTHER}
    (target / ".complete").write_text("main\n")
    with pytest.raises(ModelNotAvailable, match="not a commit"):
        download("org/tiny", "v2", target, tmp_path / "hub.json", lock)
    lock.write_text("org/tiny@main: main\n")
    with pytest.raises(ModelNotLocked, match="not a lock file"):
        verify(target, "org/tiny", "main", lock)


def test_a_download_fetches_the_locked_commit_not_the_newest(tmp_path, monkeypatch):
    """With a line in the lock, the Hub is asked for that commit (the revision is not resolved again); without
    one, the revision is resolved once and its commit fetched and locked. The Hub is out of reach here, so the two
    huggingface_hub calls are replaced by recorders."""
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, revision, local_dir, allow_patterns):
        calls.append(("fetch", repo_id, revision))
        (Path(local_dir) / "config.json").write_text("{}")

    class Api:
        def model_info(self, repo_id, revision):
            calls.append(("resolve", repo_id, revision))
            return type("Info", (), {"sha": OTHER})()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    lock = tmp_path / "models.lock.yaml"
    lock.write_text(f"org/a@main: {SHA}\n")
    info = download("org/a", None, tmp_path / "a", tmp_path / "a.json", lock)
    assert calls == [("fetch", "org/a", SHA)] and info["resolved_revision"] == SHA
    calls.clear()
    download("org/b", None, tmp_path / "b", tmp_path / "b.json", lock)
    assert calls == [("resolve", "org/b", "main"), ("fetch", "org/b", OTHER)]
    assert yaml.safe_load(lock.read_text()) == {"org/a@main": SHA, "org/b@main": OTHER}
    assert lock.read_text().startswith("# Hub models at the commit")


def test_model_paths_are_absolute_pinned_and_what_the_jobs_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = copy.deepcopy(PAPER)
    path = G.model_path(config, "qwen3-8b")
    assert path == str(tmp_path / "results" / "paper" / "hub_models" / "Qwen--Qwen3-8B" / "main")
    config["grid"]["models_dir"] = "/shared/models"
    config["grid"]["models"]["qwen3-8b"]["revision"] = "b968826d"
    assert G.model_path(config, "qwen3-8b") == "/shared/models/Qwen--Qwen3-8B/b968826d"
    assert G.model_path(config, "qwen3-1.7b") == "/shared/models/Qwen--Qwen3-1.7B/main"  # a memory model
    params = G.download_params(config, "qwen3-8b")
    assert params == {
        "hf_id": "Qwen/Qwen3-8B",
        "revision": "b968826d",
        "path": "/shared/models/Qwen--Qwen3-8B/b968826d",
        "lock": str(tmp_path / "models.lock.yaml"),
    }
    rank = G.rank_params(config, "qwen3-8b")  # rank_train's engine loads the download, not the Hub id
    assert rank["model"] == params["path"] and rank["hf_id"] == "Qwen/Qwen3-8B" and rank["revision"] == "b968826d"
    from calibrl.config import problems

    raw = copy.deepcopy(RAW)
    raw["grid"]["models"]["qwen3-8b"]["revision"] = "b968826d"
    assert problems(raw) == []
    raw["grid"]["models"]["qwen3-8b"]["revision"] = ""
    assert [k for k, _ in problems(raw)] == ["grid.models.qwen3-8b.revision"]


@pytest.mark.slow
def test_the_paper_grid_plans_one_download_per_model(paper_plan):
    """snakemake -n on config/paper.yaml: four download_model jobs (4B, 8B, 14B, DLC's 1.7B), local rules,
    writing the hub.json that records each folder."""
    text, r = paper_plan.text, paper_plan.results
    stats = text.split("Job stats:")[1]
    assert [line.split() for line in stats.splitlines() if line.startswith("download_model")] == [
        ["download_model", "4"]
    ]
    for name in ("qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-1.7b"):
        assert f"{r}/models/{name}/hub.json" in text
    # the runs wait for their downloads: DLC's for the policy's and the memory's
    dlc = (
        f"input: {r}/data/d0/train.jsonl, {r}/models/qwen3-8b/hub.json, {r}/models/qwen3-1.7b/hub.json, "
        f"{r}/runs/qwen3-8b/dapo_iac_dlc/s0/settings.json"
    )
    assert dlc in text
