"""Hub models downloaded once on the login node (rule download_model, ``calibrl.model_store``) and read by
absolute path: the offline error, a pre-seeded folder, and the path the rules and jobs are wired to.

Nothing is fetched from the Hub here: huggingface_hub runs in its own offline mode."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import filled

from calibrl import grid as G
from calibrl.model_store import ModelNotAvailable, download

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
        download("Qwen/Qwen3-8B", "abc123", target, tmp_path / "hub.json")
    text = str(err.value)
    assert str(target) in text and "login node" in text and "HF_HUB_OFFLINE is set" in text
    assert f"huggingface-cli download Qwen/Qwen3-8B --revision abc123 --local-dir {target}" in text
    assert not (tmp_path / "hub.json").exists() and not (target / ".complete").exists()


def test_a_pre_seeded_folder_is_used_as_it_is(offline, tmp_path):
    from calibrl.models import build_model, build_tokenizer, save

    target = tmp_path / "m" / "rev"
    tok = build_tokenizer()
    save(build_model(tok), tok, target)
    (target / ".complete").write_text("0123abcd\n")
    info = download("org/tiny", "rev", target, tmp_path / "hub.json")
    assert json.loads((tmp_path / "hub.json").read_text()) == info
    assert info["path"] == str(target.resolve()) and info["resolved_revision"] == "0123abcd"
    assert "config.json" in info["files"] and "model.safetensors" in info["files"]
    (target / "config.json").unlink()  # a folder that is not a model is refused, by name
    with pytest.raises(ModelNotAvailable, match="no config.json"):
        download("org/tiny", "rev", target, tmp_path / "hub.json")


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
def test_the_paper_grid_plans_one_download_per_model(tmp_path):
    """snakemake -n on config/paper.yaml: four download_model jobs (4B, 8B, 14B, DLC's 1.7B), local rules,
    writing the hub.json that records each folder."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\nexit 1\n")  # no SLURM here: fail fast
    (fake / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    args = ["-n", "--printshellcmds", "--configfile", "config/paper.yaml", "--config", f"results={tmp_path}/r"]
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    stats = text.split("Job stats:")[1]
    assert [line.split() for line in stats.splitlines() if line.startswith("download_model")] == [
        ["download_model", "4"]
    ]
    for name in ("qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-1.7b"):
        assert f"{tmp_path}/r/models/{name}/hub.json" in text
    # the runs wait for their downloads: DLC's for the policy's and the memory's
    r = f"{tmp_path}/r"
    dlc = (
        f"input: {r}/data/train.jsonl, {r}/models/qwen3-8b/hub.json, {r}/models/qwen3-1.7b/hub.json, "
        f"{r}/runs/qwen3-8b/dapo_iac_dlc/s0/settings.json"
    )
    assert dlc in text
