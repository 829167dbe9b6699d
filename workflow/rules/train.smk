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
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/train.py"
