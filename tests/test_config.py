"""The config is validated at start-up: a mistyped or invalid key fails at once, naming the key; and checking it
(at every Snakefile load) imports nothing heavy."""

import subprocess
import sys

import pytest
from conftest import REPO, load_config, snakemake, write_config

# What planning must never import (issue 45: torch alone was ~4 s of every `snakemake` command): the jobs' libraries.
# Snakemake's own SLURM plugin imports pandas and numpy, so they are not ours to keep out of a dry run.
HEAVY = ("torch", "transformers", "mlflow", "matplotlib", "vllm", "ray", "deepspeed", "datasets", "math_verify")


def mutate(cfg, path, value):
    node = cfg
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return cfg


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("tyo",), {}, "tyo"),
        (("toy", "sedes"), 3, "sedes"),
        (("toy", "steps"), "many", "many"),
        (("toy", "init"), "ones", "ones"),
        (("toy", "lr", "sgd"), -1, "-1"),
        (("toy", "estimator"), "grpoo", "grpoo"),
        (("toy", "group_sizes"), [1, 8], "1"),
        (("toy", "iac_alpha"), -0.5, "-0.5"),
        (("toy", "fig5_optimizers"), ["rmsprop"], "rmsprop"),
    ],
)
def test_bad_config_fails_at_once_naming_the_key(workflow_dir, path, value, expected):
    cfg = mutate(load_config(workflow_dir), path, value)
    bad = write_config(workflow_dir / "bad.yaml", cfg)
    proc = snakemake(workflow_dir, "-n", "--configfile", str(bad), check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "invalid config" in out and ".".join(path) in out and expected in out, out[-2000:]


def test_numbers_in_scientific_notation_are_numbers(workflow_dir):
    """PyYAML reads YAML 1.1, where 3e-4 (no dot) is a string: where the schema wants a number it is one."""
    text = (workflow_dir / "config" / "config.yaml").read_text()
    assert "    lr: 0.0003\n" in text
    sci = workflow_dir / "sci.yaml"
    changed = text.replace("    lr: 0.0003\n", "    lr: 3e-4\n").replace("memory_lr: 0.001 ", "memory_lr: 1E-3 ")
    changed = changed.replace("lr_scales: [0.3, 1.0, 3.0]", "lr_scales: [3e-1, 1.0, 3.0]")
    assert all(t in changed for t in ("    lr: 3e-4\n", "memory_lr: 1E-3 ", "lr_scales: [3e-1, 1.0, 3.0]"))
    sci.write_text(changed)
    from calibrl.config import load

    grid = load([sci])["grid"]
    assert grid["train"]["lr"] == 3e-4 and grid["train"]["memory_lr"] == 1e-3
    assert load([sci])["toy"]["lr_scales"] == [0.3, 1.0, 3.0]
    assert load([workflow_dir / "config" / "config.yaml"])["grid"]["train"] == grid["train"]
    # the workflow reads it so too (Snakemake's own YAML loading, then the config check); a word stays refused
    snakemake(workflow_dir, "-n", "--quiet", "rules", "--configfile", str(sci))
    sci.write_text(text.replace("    lr: 0.0003\n", "    lr: 3e-4x\n"))
    proc = snakemake(workflow_dir, "-n", "--configfile", str(sci), check=False)
    assert proc.returncode != 0 and "grid.train.lr: '3e-4x' is not of type 'number'" in proc.stdout + proc.stderr


def test_shipped_config_plans(workflow_dir):
    proc = snakemake(workflow_dir, "-n", "--quiet", "rules")
    assert "toy_figure" in proc.stdout


def test_paper_grid_plans_every_run_and_checkpoint(paper_plan):
    # a config file named on the command line is the whole config: no embedded default merged underneath
    proc = paper_plan  # every module the planning process imported is on its stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "calibrl.config" in imported and "calibrl.algo.advantages" in imported  # the config check ran
    assert not {m.split(".")[0] for m in imported} & set(HEAVY), sorted(m for m in imported if m.startswith(HEAVY))
    out = proc.stdout
    counts = dict(line.split()[:2] for line in out[out.index("Job stats") :].splitlines()[3:] if len(line.split()) == 2)
    # 5 methods x 3 models (Tables 2, 3) + DAPO, DAPO+IAC, DAPO+IAC+DLC (Table 4) + 4 alpha/filter (Table 5)
    assert counts["run_settings"] == counts["train_metrics"] == "22"
    # trained in segments: 5 runs of 4B x 4 segments of 500 steps, 16 of 8B and 14B x 8 of 250, DLC x 10 of 200
    assert counts["train"] == str(5 * 4 + 16 * 8 + 10)  # the DLC run in segments of 200 (generation in waves)
    assert counts["evaluate"] == str(22 * 40)  # every 50 steps of 2000
    assert counts["data_download"] == "7"  # DeepScaleR and the six benchmarks
    assert counts["aggregate"] == "1"
    assert counts["rank_train"] == "1"  # the filtering baseline's ranking, once for Qwen3-8B


def test_the_config_check_imports_nothing_heavy():
    """Issue 45: the config check (``calibrl.config.validate``, the Snakefile's first step) and the typed view the
    rule files read at parse time import no torch, transformers, MLflow...: the registries' names are read from
    modules that import torch only inside their formulas (``calibrl.algo``), and the backends' layouts and the
    planner from modules that defer their jobs' libraries. Each shipped grid, in a fresh interpreter."""
    code = f"""
import sys
from calibrl import config, grid, preflight
for path in ("config/paper.yaml", "config/config.yaml", ".test/config.yaml", "config/cluster_smoke.yaml"):
    cfg = config.load([path])
    runs = grid.runs(cfg)
    grid.model_files(cfg), grid.eval_params(cfg), grid.engine_request(cfg), preflight.shapes(cfg)
    grid.train_params(cfg, runs[0]), grid.inputs(cfg, runs[0]), grid.segment_ends(cfg, runs[0])
assert "grpo" in config.schema()["$defs"]["estimator"]["enum"]
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["[]"], proc.stdout
