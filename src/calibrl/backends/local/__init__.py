"""The CPU backend: tiny Qwen3 models warm-started here (``warmstart``) and trained by the compact trainer
(``trainer``), in one process per run, every formula from ``calibrl.algo``."""

from __future__ import annotations

from pathlib import Path

from calibrl.checkpoints import RunStamp
from calibrl.runs import Run, checkpoint_steps
from calibrl.spec import MethodSpec

METRICS = Path("ckpt") / "metrics.jsonl"
"""The trainer's per-step log, relative to the run folder; rule train_metrics publishes it as ``metrics.jsonl``."""


class LocalBackend:
    name = "local"
    # The trainer's first k steps do not depend on how many follow (constant learning rate, data order from the
    # seed), so a longer run resumes a shorter one's checkpoints.
    extends_runs = True
    env = "../../envs/local.yaml"
    ignored = {
        "retention": "the CPU trainer's checkpoints are small and resumed from",
        "models_dir": "tiny models are built here, never downloaded",
    }
    preload = ("calibrl.backends.local.trainer", "calibrl.backends.local.warmstart")
    gpu = None  # one process per run on this machine's CPUs (the rule's threads): no GPU side

    def problems(self, grid: dict, runs: list[tuple[Run, MethodSpec]]) -> list[tuple[str, str]]:
        out = []
        if "warmstart" not in grid:
            out.append(("grid.warmstart", "required when grid.trainer is local (tiny models are warm-started)"))
        for kind in ("models", "memory_models"):
            for name, spec in grid[kind].items():
                if "hf_id" in spec:
                    what = "trainer local builds tiny models: give an architecture, not hf_id"
                    out.append((f"grid.{kind}.{name}", what))
        return out

    def model_file(self, model: str, data: int) -> str:
        return f"models/{model}/d{data}/init.json"  # rule warmstart, on data seed {data}'s problems

    def inputs(self, grid: dict, run: Run, spec: MethodSpec, data: int) -> dict[str, str]:
        out = {"init": self.model_file(run.model, data)}
        if spec.uses_dlc:
            out["memory"] = self.model_file(grid["models"][run.model]["memory"], data)
        return out  # the filtering baseline ranks its queries in the training job, at step 0

    def segments(self, grid: dict, run: Run, spec: MethodSpec) -> list[int]:
        """One job per checkpoint: a checkpoint's evaluation then depends on a segment that a longer run keeps
        (extending ``steps`` trains and evaluates only the new checkpoints), and evaluates while the next trains."""
        steps = int(grid["train"]["steps"])
        return sorted({*checkpoint_steps(grid["train"]["eval_every"], steps), steps})

    def warmstart(self, params: dict, sft_path: str, model_dir: str, info_path: str, threads: int) -> None:
        from calibrl.backends.local.warmstart import warmstart_job

        warmstart_job(params, sft_path, model_dir, info_path, threads)

    def train(self, settings_path: str, stop_at: int, threads: int, workers: int) -> None:
        import torch

        from calibrl.backends.local.trainer import Trainer
        from calibrl.data.records import read_jsonl
        from calibrl.tasks import Scorer

        stamp = RunStamp.read(settings_path)
        paths = stamp.paths
        torch.set_num_threads(max(1, int(threads)))  # Snakemake runs jobs side by side
        records = read_jsonl(paths["train"], on_error=stamp.settings["on_error"])
        with Scorer(workers=workers) as scorer:
            Trainer(
                stamp.method,
                stamp.train_settings(steps=stop_at),
                records,
                paths["init"],
                Path(settings_path).parent,
                scorer,
                seed=stamp.seed,
                memory_dir=paths.get("memory"),
                template=stamp.settings["template"],
            ).run()

    def metrics(self, run_dir: str, out_path: str) -> None:
        from calibrl.io import write_text

        write_text(out_path, (Path(run_dir) / METRICS).read_text(encoding="utf-8"))


BACKEND = LocalBackend()
