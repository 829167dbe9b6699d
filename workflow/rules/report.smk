# Aggregation: the paper's tables and figures from the result files, and the MLflow sync
# (the single writer of the grid's MLflow runs).


rule aggregate:
    input:
        evals=ALL_EVALS,
        metrics=ALL_METRICS,
    output:
        done=res("aggregate.json"),
        summary=res("summary.md"),
        tables=expand(res("tables/{table}.{ext}"), table=["table2", "table3", "table4", "table5"], ext=["csv", "md"]),
        figure6=res("figures/figure6_entropy.png"),
    params:
        grid=GRID,
        store=res("mlflow"),
        experiment=config["mlflow_experiment"],
    log:
        res("logs/aggregate.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/aggregate.py"
