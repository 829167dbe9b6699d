# Data: the synthetic countdown task of the embedded default (train, in-distribution test, harder ood).


rule data_synthetic:
    output:
        expand(res("data/{split}.jsonl"), split=SPLITS),
        manifest=res("data/manifest.json"),
    params:
        data=GRID["data"],
    log:
        res("logs/data/synthetic.log"),
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/data_synthetic.py"
