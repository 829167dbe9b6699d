# Evaluation: one job per checkpoint, n samples per problem on every evaluation split, graded.


rule evaluate:
    input:
        marker=res("runs/{model}/{method}/s{seed}/ckpt/step_{step}.done"),
        splits=expand(res("data/{split}.jsonl"), split=GRID["data"]["eval_splits"]),
    output:
        res("runs/{model}/{method}/s{seed}/eval/step_{step}.json"),
    params:
        grid=GRID,
        split_names=GRID["data"]["eval_splits"],
    log:
        res("logs/evaluate/{model}/{method}/s{seed}/step_{step}.log"),
    threads: 1
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/evaluate.py"
