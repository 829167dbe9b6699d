# Training: the warm start (supervised fine-tuning of a fresh tiny Qwen3) and one RL run per
# (model, method, seed). Weights live under ckpt/ undeclared, so a failed job keeps them and resumes;
# Snakemake tracks the small per-checkpoint markers.


rule warmstart:
    input:
        train=res("data/train.jsonl"),
    output:
        model=directory(res("models/{model}/init")),
        info=res("models/{model}/init.json"),
    params:
        grid=GRID,
    log:
        res("logs/warmstart/{model}.log"),
    threads: 1
    priority: 20  # the head of the longest chain (warm start -> training -> evaluation): start it first
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/warmstart.py"


rule train:
    input:
        unpack(train_inputs),
    output:
        markers=expand(
            res("runs/{{model}}/{{method}}/s{{seed}}/ckpt/step_{step}.done"), step=EVAL_STEPS
        ),
        metrics=res("runs/{model}/{method}/s{seed}/metrics.jsonl"),
    params:
        grid=GRID,
        run_dir=run_dir,
    log:
        res("logs/train/{model}/{method}/s{seed}.log"),
    threads: 1
    priority: 10  # longer than evaluations: with a fixed number of cores, long jobs first finish soonest
    conda:
        "../../envs/local.yaml" if LOCAL else "../../envs/cluster-train.yaml"
    script:
        "../../scripts/train.py"


# Paper scale, filtering baseline (Table 5): every training query's success rate under the initial model,
# sampled with vLLM once per model and shared by the seeds that drop the easiest share.
rule rank_train:
    input:
        train=res("data/train.jsonl"),
    output:
        res("models/{model}/train_success.json"),
    params:
        grid=GRID,
    log:
        res("logs/rank_train/{model}.log"),
    threads: 1
    conda:
        "../../envs/cluster-eval.yaml"
    script:
        "../../scripts/rank_train.py"
