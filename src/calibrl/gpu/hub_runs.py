"""What the GPU backends share before any job: each trains the Hub's models (the login node's downloads) in SLURM
segments, so each makes the same config checks, asks for the same input files and cuts a run the same way. A
backend adds the checks of its own trainer (its estimators, what it cannot run) to :func:`problems`'."""

from __future__ import annotations

from calibrl.runs import Run
from calibrl.spec import MethodSpec


def problems(grid: dict, runs: list[tuple[Run, MethodSpec]], trainer: str) -> list[tuple[str, str]]:
    """(config key, why) for what no GPU backend can train: tiny models or the countdown task, the control arm, a
    smoke subset smaller than one step after a method's filter, mini-batches that split a group, segments and saves
    that miss an evaluated step."""
    out = []
    if grid["data"]["source"] == "countdown":
        out.append(("grid.data.source", "countdown goes with grid.trainer local (tiny models)"))
    for kind in ("models", "memory_models"):
        for name, spec in grid[kind].items():
            if "hf_id" not in spec:
                out.append((f"grid.{kind}.{name}", f"trainer {trainer} needs hf_id (a Hugging Face model)"))
    batch = grid["train"]["prompts_per_step"]
    for spec in {spec.name: spec for _, spec in runs}.values():
        if spec.shuffle_rewards:
            out.append((f"grid.methods.{spec.name}.shuffle_rewards", "the control arm runs on trainer local only"))
        if "subset" in grid["data"]:  # a smoke run's rows: a step takes a whole batch of prompts
            rows = grid["data"]["subset"]
            kept = rows - round(spec.filter_easiest * rows)  # calibrl.algo.filtering.keep_indices
            if kept < batch:
                why = f", {kept} after method {spec.name}'s filter_easiest {spec.filter_easiest:g}," * spec.filters
                out.append(("grid.data.subset", f"{rows} training rows{why} are fewer than one step's "
                                                f"{batch} prompts (grid.train.prompts_per_step)"))  # fmt: skip
    if batch % grid["train"]["ppo_minibatches"]:  # each optimizer step takes whole groups
        what = f"does not divide grid.train.prompts_per_step ({batch}): each optimizer step takes whole groups"
        out.append(("grid.train.ppo_minibatches", what))
    evals = grid["train"]["eval_every"]
    for name, spec in grid["models"].items():
        if "resources" not in spec:  # a tiny model (refused above)
            continue
        for key, lay in (("resources", spec["resources"]), ("resources.dlc", spec["resources"]["dlc"])):
            every = lay.get("segment_steps")
            if every and every % evals:
                what = f"{every} is not a multiple of grid.train.eval_every ({evals})"
                out.append((f"grid.models.{name}.{key}.segment_steps", what + ": a segment ends on a checkpoint"))
            saves = lay.get("ds_save_steps")
            if saves and evals % saves:
                what = f"{saves} does not divide grid.train.eval_every ({evals}): an evaluated step needs its state"
                out.append((f"grid.models.{name}.{key}.ds_save_steps", what))
    return out


def model_file(model: str) -> str:
    """The file rule download_model writes for ``model`` on the login node (one for every data seed)."""
    return f"models/{model}/hub.json"


def inputs(grid: dict, run: Run, spec: MethodSpec) -> dict[str, str]:
    """A run's input files: its policy's download, its memory's (DLC), the initial model's success rates on the
    training set (the filtering baseline; rule rank_train, with vLLM, once per model)."""
    out = {"init": model_file(run.model)}
    if spec.uses_dlc:
        out["memory"] = model_file(grid["models"][run.model]["memory"])
    if spec.filters:
        out["success"] = f"models/{run.model}/train_success.json"
    return out


def segments(steps: int, layout: dict) -> list[int]:
    """The steps each SLURM job of a run ends at: every ``segment_steps`` of its layout (a multiple of
    ``eval_every``; unset: one job) and ``steps``; each job resumes from the previous one's saved state, so a run
    longer than a SLURM time limit still finishes."""
    every = int(layout.get("segment_steps") or steps)
    return sorted({*range(every, int(steps), every), int(steps)})
