# The softmax experiments of Section 2.4 and Appendices G, H: one rule per figure, the verdicts,
# and the MLflow sync (the single writer of the toy's MLflow runs).


rule toy_figure:
    output:
        seeds=res("toy/{figure}/seeds.csv.gz"),
        curves=res("toy/{figure}/curves.csv"),
        stats=res("toy/{figure}/stats.csv"),
        plot=report(
            res("toy/{figure}/plot.png"),
            caption="../report/toy_figure.rst",
            category="2.4 Softmax toy (Figures 1-5)",
            subcategory="{figure}",
            labels={"figure": "{figure}"},
        ),
    params:
        toy=config["toy"],
    log:
        res("logs/toy/{figure}.log"),
    threads: 1
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/toy_figure.py"


rule toy_verdicts:
    input:
        seeds=expand(res("toy/{figure}/seeds.csv.gz"), figure=TOY_FIGURES),
    output:
        md=res("toy/verdicts.md"),
        html=report(
            res("toy/verdicts.html"),
            caption="../report/toy_verdicts.rst",
            category="2.4 Softmax toy (Figures 1-5)",
            subcategory="verdicts",
            labels={"figure": "verdicts"},
        ),
        csv=res("toy/verdicts.csv"),
        claims=res("toy/claims.csv"),
    params:
        toy=config["toy"],
        figures=TOY_FIGURES,
    log:
        res("logs/toy/verdicts.log"),
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/toy_verdicts.py"


rule toy_mlflow:
    input:
        plots=expand(res("toy/{figure}/plot.png"), figure=TOY_FIGURES),
        stats=expand(res("toy/{figure}/stats.csv"), figure=TOY_FIGURES),
        curves=expand(res("toy/{figure}/curves.csv"), figure=TOY_FIGURES),
        verdicts=res("toy/verdicts.md"),
    output:
        runs=res("toy/mlflow_runs.json"),
    params:
        toy=config["toy"],
        figures=TOY_FIGURES,
        store=res("mlflow"),
        experiment=config["mlflow_experiment"],
    log:
        res("logs/toy/mlflow.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/toy_mlflow.py"


rule toy:
    input:
        expand(res("toy/{figure}/plot.png"), figure=TOY_FIGURES),
        res("toy/verdicts.md"),
        res("toy/mlflow_runs.json"),
