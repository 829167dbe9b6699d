"""The ``calibrl`` command: the jobs of the workflow, usable by hand."""

from __future__ import annotations

import argparse
import logging
import re
import sys


def _toy_defaults() -> dict:
    """The config schema's ``toy`` section with its defaults: what ``calibrl toy`` runs unless told otherwise."""
    from calibrl.config import filled

    return filled("toy", {})


def _toy(args: argparse.Namespace) -> int:
    from calibrl.algo.advantages import ESTIMATORS
    from calibrl.io import write_csv
    from calibrl.toy.figures import toy_setting
    from calibrl.toy.sim import ToySetting, run

    if args.estimator is not None and args.estimator not in ESTIMATORS:
        raise SystemExit(f"calibrl toy: --estimator must be one of {ESTIMATORS.names()}")
    fields = ToySetting.__dataclass_fields__  # the options named after a field set it (the others: --out)
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    setting = toy_setting(_toy_defaults(), **given)
    frame = run(setting)
    write_csv(args.out, frame)
    last = frame[frame["step"] == frame["step"].max()]
    print(
        f"wrote {len(frame)} rows to {args.out}; final seed means: "
        + ", ".join(f"{c}={last[c].mean():.3f}" for c in frame.columns if c.startswith("p_"))
    )
    return 0


def _tables(args: argparse.Namespace) -> int:
    """Print the aggregated tables of a results folder; beside the paper's numbers when they are comparable."""
    from pathlib import Path

    folder = Path(args.results) / "tables"
    names = args.table or ["table2", "table3", "table4", "table5"]
    _check_current(Path(args.results))
    for name in names:
        # The _vs_paper pages already hold ours beside the paper's (cell by cell when the grid is the paper's,
        # orderings only otherwise): the aggregation decided that from the data, so the CLI need not guess.
        path = folder / (f"{name}_vs_paper.md" if args.paper else f"{name}.md")
        if not path.is_file():
            raise ValueError(
                f"{path} does not exist: run the workflow's aggregate rule first "
                f"(snakemake --cores 2 {path}), or point --results at the config's results folder"
            )
        print(_for_terminal(path.read_text(encoding="utf-8")))
    summary = Path(args.results) / "summary.md"
    if args.paper and summary.is_file():
        print(_for_terminal(summary.read_text(encoding="utf-8").split("## Seed noise")[0]))
    return 0


def _trainers(args: argparse.Namespace) -> int:
    """The same grid cells trained by two trainers, side by side (calibrl.report.trainers)."""
    from calibrl.io import write_csv, write_text
    from calibrl.report.trainers import compare, render

    trainers, evals, train = compare(args.first, args.second)
    text = render(trainers, evals, train)
    if args.out:
        write_text(args.out, text)
    if args.csv:
        write_csv(args.csv, evals)
    print(text)
    return 0


def _check_current(results) -> None:
    """Refuse tables whose result files are gone (a run folder deleted or moved), and say when some are newer
    than the tables (a run redone since): the tables would report what no longer is."""
    import json
    import os

    done = results / "aggregate.json"
    if not done.is_file():
        return  # the tables' own check below names the missing aggregation
    inputs = [results / p for p in json.loads(done.read_text()).get("inputs", [])]
    gone = [p for p in inputs if not p.exists()]
    if gone:
        raise ValueError(
            f"{len(gone)} of the {len(inputs)} result files the tables were made from are gone (first: {gone[0]}): "
            "a run folder was deleted or moved; rerun the workflow (the snakemake command you ran) to redo those "
            "runs and the tables"
        )
    newer = [p for p in inputs if os.stat(p).st_mtime > os.stat(done).st_mtime]
    if newer:
        print(f"calibrl tables: {len(newer)} result files are newer than these tables (first: {newer[0]}); rerun "
              "the workflow to update them", file=sys.stderr)  # fmt: skip


def _for_terminal(markdown: str) -> str:
    """The tables' Markdown as a terminal shows it: the paper's underline of a second best (``<u>x</u>``, HTML in
    the Markdown files, which the HTML report renders) as ``_x_``."""
    import re

    return re.sub(r"<u>(.*?)</u>", r"_\1_", markdown)


def _ui(args: argparse.Namespace) -> int:
    """The MLflow UI on a results folder's store: its artifact locations made the folder's own first (a moved or
    copied results folder), then ``mlflow ui`` in this process's place."""
    import os
    from pathlib import Path

    from calibrl.tracking import Store, StoreError

    try:
        store = Store(Path(args.results) / "mlflow", must_exist=True)
    except StoreError as err:
        raise ValueError(str(err)) from err
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store.uri, "--host", args.host,
           "--port", str(args.port)]  # fmt: skip
    print(f"calibrl ui: http://{args.host}:{args.port} ({store.uri})", flush=True)
    os.execv(sys.executable, cmd)
    return 0  # not reached


def _plan(args: argparse.Namespace) -> int:
    """Print GPU-hours, wall time and disk per rule and for the grid (calibrl.plan), then SLURM warnings."""
    from pathlib import Path

    import yaml

    from calibrl import config as C
    from calibrl import grid as G
    from calibrl import plan as P

    overrides = {}
    for path in args.assumptions or []:
        overrides.update({k: float(v) for k, v in (yaml.safe_load(Path(path).read_text()) or {}).items()})
    overrides.update(P.parse_assume(args.assume or []))
    config = C.load(args.configfile)
    if G.backend(config).gpu is None:
        print(f"grid.trainer {config['grid']['trainer']}: its runs take no GPUs, nothing to price")
        return 0
    profiles = args.profile or ["slurm"]  # as `snakemake --profile slurm`, from the checkout's root
    try:
        profile = P.read_profile(*profiles)
    except FileNotFoundError as err:
        if args.profile:
            raise ValueError(str(err)) from None
        profile = None  # no profile here: GPUs alone decide how many jobs share a node
    requests = P.slurm_requests(profile) if profile is not None else None
    rows, trains = P.plan(config, overrides, requests)
    print(P.render(rows, trains, overrides, gpus=args.gpus))
    grid = config["grid"]
    hub = {m: spec for m, spec in {**grid["models"], **grid["memory_models"]}.items() if "hf_id" in spec}
    unpinned = [m for m, spec in hub.items() if not re.fullmatch(r"[0-9a-f]{40}", spec["revision"])]  # not a commit
    if unpinned:
        print(
            f"\nNOTE models without a pinned revision (grid.models.<name>.revision, a branch or tag: default main): "
            f"it is resolved once and locked in {G.models_lock(config)}: {unpinned}"
        )
    if profile is None:
        print("\nNOTE no SLURM profile read (--profile): jobs per node counted by GPUs alone, no time limits checked")
        return 0
    names = " + ".join(map(str, profiles))
    warnings = P.check_runtimes(rows, P.slurm_runtimes(profile), overrides)
    warnings += P.check_gpus(config, P.slurm_gpus(profile))
    print("\n".join(["", f"SLURM time limits ({names}):", *(warnings or ["  every job fits"])]))
    problems = P.check_nodes(config, requests, overrides)
    print("\n".join(["", f"SLURM requests against a node ({names}):", *(problems or ["  every job fits a node"])]))
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calibrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    toy = sub.add_parser(
        "toy",
        help="run one configuration of the softmax toy (Section 2.4) over many seeds",
        description="Simulate the linear softmax policy of Section 2.4 trained on the Persian query, "
        "vectorised over seeds, and write one CSV row per (seed, recorded step) with the tracked "
        "probabilities p_cat, p_dog, p_persian, p_siamese of the Persian query (and p_siamese_heldout "
        "when --siamese is given).",
    )
    d = "the config schema's toy."  # its defaults, read when the toy runs (G, optimizer, IAC, DLC: the plain ones)
    toy.add_argument("--estimator", help="advantage estimator: raw, mean, norm (GRPO), rloo, rpp (Reinforce++ "
                     f"with baseline), drgrpo (default: {d}estimator)")  # fmt: skip
    toy.add_argument("--group-size", "-G", type=int, help="responses sampled per step, G (default: 8)")
    toy.add_argument("--optimizer", choices=("sgd", "momentum", "adamw"),
                     help=f"optimizer (default: sgd; momentum is SGD with momentum {d}momentum)")  # fmt: skip
    toy.add_argument("--lr", type=float, help=f"learning rate (default per optimizer: {d}lr)")
    toy.add_argument("--steps", type=int, help=f"training steps (default: {d}steps; the paper's are 500)")
    toy.add_argument("--seeds", type=int, help=f"independent seeds, simulated at once (default: {d}seeds)")
    toy.add_argument("--seed", type=int, help=f"random seed of the whole run (default: {d}seed)")
    toy.add_argument("--init", choices=("zero", "random", "warm"),
                     help="initial weights: zero (uniform policy), random (N(0, 0.01)), warm (both correct labels "
                     f"at 0.4) (default: {d}init)")  # fmt: skip
    toy.add_argument("--iac-alpha", type=float, help="IAC strength alpha, 0 = off (default: 0)")
    toy.add_argument("--dlc-mu", type=float, help="DLC memory weight mu, 0 = off (default: 0)")
    toy.add_argument("--memory-lr", type=float, help=f"SGD learning rate of the DLC memory (default: {d}memory_lr)")
    toy.add_argument("--siamese", choices=("high", "mid", "low"),
                     help="also track the held-out Siamese query at this similarity (Figure 2)")  # fmt: skip
    toy.add_argument("--record-every", type=int, help=f"record every N steps (default: {d}record_every)")
    toy.add_argument("--out", required=True, help="output CSV file (.csv or .csv.gz)")
    toy.set_defaults(func=_toy)

    tables = sub.add_parser(
        "tables",
        help="print the aggregated Tables 2-5 of a results folder, beside the paper's published numbers",
        description="Print the tables the aggregate rule wrote under RESULTS/tables. By default each table is "
        "shown beside the paper's: cell by cell (ours / paper (difference)) when the results come from the "
        "paper's grid (config/paper.yaml: same models, benchmarks and k), otherwise ours and the paper's "
        "tables with the paper's orderings checked on ours (signs only). --no-paper prints ours alone.",
    )
    tables.add_argument(
        "--results",
        default="results",
        help="results folder of the run (the config's `results:`; default: results; the paper config "
        "writes results/paper)",
    )
    tables.add_argument(
        "--table", action="append", choices=("table2", "table3", "table4", "table5"), help="only this table"
    )
    tables.add_argument("--no-paper", dest="paper", action="store_false", help="our tables only")
    tables.set_defaults(func=_tables)

    trainers = sub.add_parser(
        "trainers",
        help="the same grid cells trained by two trainers, side by side (AVG@k, PASS@k, training metrics)",
        description="Match the runs of two results folders, each trained by one trainer (grid.trainer), and show "
        "each evaluated step under both with the difference and its interval paired over problems. A run whose "
        "settings differ beyond its trainer, or whose checkpoints were evaluated differently, is refused by key.",
    )
    trainers.add_argument("first", help="results folder of one trainer (the config's `results:`)")
    trainers.add_argument("second", help="results folder of the other trainer; differences are second - first")
    trainers.add_argument("--out", help="also write the table here (markdown)")
    trainers.add_argument("--csv", help="also write the evaluations' rows here (CSV)")
    trainers.set_defaults(func=_trainers)

    ui = sub.add_parser(
        "ui",
        help="open the MLflow UI on a results folder's store (also after the folder was moved or copied)",
        description="Serve the MLflow UI on RESULTS/mlflow. The store records its artifacts' absolute place: a "
        "results folder moved or copied elsewhere has them pointed at its own artifacts first.",
    )
    ui.add_argument("--results", default="results", help="results folder of the run (default: results)")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000, help="port (default: 5000)")
    ui.set_defaults(func=_ui)

    plan = sub.add_parser(
        "plan",
        help="estimate GPU-hours, wall time and disk per rule and for the whole grid, before submitting",
        description="Estimate what a grid config costs from a stated throughput model (calibrl.plan.ASSUMPTIONS, "
        "printed with their sources), and warn for each rule whose job would outrun its SLURM runtime.",
    )
    plan.add_argument("--configfile", nargs="+", required=True, help="config file(s), layered as snakemake does")
    plan.add_argument("--assume", action="append", metavar="NAME=VALUE", help="override one assumption")
    plan.add_argument("--gpus", type=int, default=8, help="GPUs you have, for the wall time on them [8]")
    plan.add_argument("--assumptions", action="append", metavar="FILE", help="YAML file of NAME: VALUE overrides")
    plan.add_argument(
        "--profile",
        action="append",
        metavar="PROFILE",
        help="SLURM profile (a folder with config.yaml, or the file), repeated to layer them as snakemake does "
        "(--profile slurm --profile slurm/smoke); its CPUs and memory per rule decide how many jobs share a node, "
        "its runtimes are checked (read only) [slurm]",
    )
    plan.set_defaults(func=_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"calibrl {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
