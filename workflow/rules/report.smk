# Aggregation: the claims (the analysis plan's primaries decided with Holm over them; the rest, the toy's too,
# exploratory), the paper's tables beside the published numbers, figures and the summary (rule aggregate), then the
# final MLflow view of them (rule grid_mlflow; calibrl.live logged each run while it ran; a broken store fails that
# rule only, never the tables). Params are the config slices each rule reads. Outputs marked report() make
# `snakemake --report results/report.html`.

TABLES = ["table2", "table3", "table4", "table5"]
ACCURACY_METRICS = [f"avg_at_{GRID['eval']['k']}", f"pass_at_{GRID['eval']['k']}"]
TABLE_SECTIONS = {  # table -> report category (the paper's section)
    "table2": "4.2 Main results (Tables 2, 3)",
    "table3": "4.2 Main results (Tables 2, 3)",
    "table4": "4.2 Compatibility with DAPO (Table 4)",
    "table5": "Appendix I, Table 5 (alpha and filtering)",
}


rule aggregate:
    input:
        evals=ALL_EVALS,
        metrics=ALL_METRICS,
        toy=res("toy/claims.csv"),
        plan=PLAN or [],
    output:
        done=res("aggregate.json"),
        claims=report(
            res("claims.csv"),
            caption="../report/claims.rst",
            category="Summary (the paper's orderings)",
            labels={"what": "claims"},
        ),
        summary=res("summary.md"),
        summary_html=report(
            res("summary.html"),
            caption="../report/summary.rst",
            category="Summary (the paper's orderings)",
            labels={"what": "summary"},
        ),
        tables=expand(res("tables/{table}.{ext}"), table=TABLES, ext=["csv", "md"]),
        beside=expand(res("tables/{table}_vs_paper.{ext}"), table=TABLES, ext=["csv", "md"]),
        beside_html=[
            report(
                res(f"tables/{table}_vs_paper.html"),
                caption="../report/table.rst",
                category=TABLE_SECTIONS[table],
                labels={"table": table},
            )
            for table in TABLES
        ],
        figure6=report(
            res("figures/figure6_entropy.png"),
            caption="../report/figure6.rst",
            category="Appendix I, Figure 6 (entropy)",
            labels={"figure": "Figure 6"},
        ),
        curves=report(
            expand(res("figures/{metric}_{model}.png"), metric=ACCURACY_METRICS, model=list(GRID["models"])),
            caption="../report/accuracy.rst",
            category="Training curves",
            labels=lambda w: {"figure": "accuracy over steps"},
        ),
        entropy=report(
            res("figures/entropy_all.png"),
            caption="../report/entropy.rst",
            category="Training curves",
            labels={"figure": "entropy, every method"},
        ),
        sharpening=report(
            expand(
                res("figures/{what}_{model}.png"),
                what=["pass_at_k", "distinct_correct", "entropy_bands"],
                model=GRID["main_model"],
            ),
            caption="../report/sharpening.rst",
            category="Over-sharpening (pass@k, distinct answers, entropy)",
            labels=lambda w: {"figure": "over-sharpening"},
        ),
        sharpening_csv=expand(
            res("tables/{what}_{model}.csv"),
            what=["pass_at_k", "distinct_correct", "entropy_bands"],
            model=GRID["main_model"],
        ),
        primary=report(
            res("figures/primary_claims.png"),
            caption="../report/sharpening.rst",
            category="Summary (the paper's orderings)",
            labels={"figure": "primary claims over steps"},
        ),
    params:
        seed=GRID["seed"],
        main_model=GRID["main_model"],
        models=list(GRID["models"]),
        tables=GRID["tables"],
        eval={k: GRID["eval"][k] for k in ("n", "k")},
        train={k: GRID["train"][k] for k in ("steps", "eval_every", "group_size", "prompts_per_step")},
        eval_splits=GRID["data"]["eval_splits"],
        source=GRID["data"]["source"],  # countdown: Definition 2.1's claims (every correct mode is listed)
        data_seed=GRID["data"]["seed"],  # the data seed of seeds the plan does not draw (claims test over data seeds)
        methods=list(GRID["methods"]),  # their order: one colour per method in every figure
        claims=GRID["claims"],
    log:
        res("logs/aggregate.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/aggregate.py"


# What the grid's MLflow runs hold besides the result files: rule grid_mlflow's params, and the live view's.
ARCHITECTURES = {m: {k: v for k, v in a.items() if k != "memory"} for m, a in GRID["models"].items()}
MLFLOW_METHODS = {m: G.method(config, m).to_dict() for m in sorted({r.method for r in RUNS})}


rule grid_mlflow:
    input:
        rules.aggregate.output,
        evals=ALL_EVALS,
        metrics=ALL_METRICS,
    output:
        runs=res("grid_mlflow.json"),  # not under mlflow*: --lint takes params.store as its prefix
    params:
        seed=GRID["seed"],
        trainer=GRID["trainer"],
        architectures=ARCHITECTURES,
        methods=MLFLOW_METHODS,
        tables=GRID["tables"],
        train=GRID["train"],
        eval=GRID["eval"],
        store=res("mlflow"),
        experiment=config["mlflow_experiment"],
    log:
        res("logs/grid_mlflow.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/grid_mlflow.py"


# The live view (calibrl.live, started by the Snakefile's onstart): each run's files as grid_mlflow reads them.
LIVE_SPEC = {
    "root": RESULTS,
    "store": res("mlflow"),
    "experiment": config["mlflow_experiment"],
    "architectures": ARCHITECTURES,
    "grid": {
        "seed": GRID["seed"],
        "trainer": GRID["trainer"],
        "models": ARCHITECTURES,
        "methods": MLFLOW_METHODS,
        "tables": GRID["tables"],
        "train": GRID["train"],
        "eval": GRID["eval"],
    },
    "runs": [
        {
            "run": r.path,
            "evals": [run_outputs(r, f"eval/step_{k}.json") for k in EVAL_STEPS],
            "base": next((p for p in BASE_EVALS if p == res(f"runs/{r.model}/base/s{r.seed}/eval/step_0.json")), ""),
        }
        for r in RUNS
    ],
}
