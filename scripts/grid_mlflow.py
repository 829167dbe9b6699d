"""Snakemake script of rule grid_mlflow: the MLflow view of the grid and the claims (calibrl.report.mlflow_view)."""

from pathlib import Path

from calibrl.logs import setup
from calibrl.report.mlflow_view import sync_grid_mlflow

if __name__ == "__main__":
    setup(snakemake.log[0])
    p = snakemake.params
    grid = {"seed": p.seed, "trainer": p.trainer, "models": p.architectures, "methods": p.methods, "tables": p.tables,
            "train": p.train, "eval": p.eval}  # fmt: skip
    results = str(Path(snakemake.output.runs).parent)
    sync_grid_mlflow(grid, list(snakemake.input.evals), list(snakemake.input.metrics), results, p.store,
                     p.experiment, snakemake.output.runs, architectures=p.architectures)  # fmt: skip
