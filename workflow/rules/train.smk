# Training: the warm start (supervised fine-tuning of a fresh tiny Qwen3) and one RL run per
# (model, method, seed). Weights live under ckpt/ undeclared, so a failed job keeps them and resumes;
# Snakemake tracks the small per-checkpoint markers. Checkpoints are stamped with the fingerprint of the
# run's params: a job whose settings changed sets the old ones aside and trains from scratch
# (calibrl.checkpoints).


rule warmstart:
    input:
        train=res("data/train.jsonl"),
    output:
        model=directory(res("models/{model}/init")),
        info=res("models/{model}/init.json"),
    params:
        settings=warmstart_params,
    log:
        res("logs/warmstart/{model}.log"),
    threads: 1
    priority: 20  # the head of the longest chain (warm start -> training -> evaluation): start it first
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/warmstart.py"


# The run's identity: its config slice and the digests of its inputs (calibrl.checkpoints.stamp). Training
# and evaluation read it, so a changed setting or input reruns both; a resumed run reruns neither.
rule run_settings:
    input:
        unpack(train_inputs),
    output:
        res("runs/{model}/{method}/s{seed}/settings.json"),
    params:
        settings=train_params,
    log:
        res("logs/run_settings/{model}/{method}/s{seed}.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/run_settings.py"


if LOCAL:

    rule train:
        input:
            unpack(train_inputs),
            settings=run_settings,
            splits=expand(res("data/{split}.jsonl"), split=EVAL_SPLITS) if INLINE_EVAL else [],
        output:
            markers=expand(
                res("runs/{{model}}/{{method}}/s{{seed}}/ckpt/step_{step}.done"), step=EVAL_STEPS
            ),
            metrics=res("runs/{model}/{method}/s{seed}/metrics.jsonl"),
            # CPU evaluator too: the checkpoints' evaluations, made in the same job once trained (INLINE_EVAL)
            evals=expand(res("runs/{{model}}/{{method}}/s{{seed}}/eval/step_{step}.json"), step=EVAL_STEPS)
            if INLINE_EVAL
            else [],
        params:
            steps=G.run_length(config),  # how far, not what: a longer run resumes the shorter one's checkpoints
            run_dir=run_dir,
            # INLINE_EVAL: how the checkpoints are evaluated; a change reruns the job, which resumes from its
            # last checkpoint (nothing to train) and evaluates again
            evaluation=EVAL_PARAMS if INLINE_EVAL else None,
            split_names=EVAL_SPLITS,
            eval_steps=EVAL_STEPS,
        log:
            res("logs/train/{model}/{method}/s{seed}.log"),
        threads: 1
        resources:
            grading_workers=WORKERS,
        priority: 10  # longer than evaluations: with a fixed number of cores, long jobs first finish soonest
        conda:
            "../../envs/local.yaml"
        script:
            "../../scripts/train.py"

else:

    # Paper scale: a run trains in segments (grid.models.<model>.resources.segment_steps), each one SLURM job
    # that fits the time limit and resumes from the previous segment's checkpoint; a segment's checkpoints are
    # evaluated while the next one trains. The request (nodes, GPUs per node) comes from the run's layout
    # (calibrl.layout), which the config check has matched against Ray's demand.
    rule train:
        input:
            unpack(train_inputs),
            settings=run_settings,
            previous=previous_segment,
        output:
            res("runs/{model}/{method}/s{seed}/ckpt/segment_{end}.done"),
        params:
            steps=G.run_length(config),
            end=lambda wildcards: int(wildcards.end),
            layout=layout_params,  # how, not what: no part of the fingerprint
            run_dir=run_dir,
        log:
            res("logs/train/{model}/{method}/s{seed}/segment_{end}.log"),
        threads: 1
        resources:
            grading_workers=WORKERS,
            nodes=lambda wildcards: train_request(wildcards)["nodes"],
            gres=lambda wildcards: train_request(wildcards)["gres"],
        priority: 10
        conda:
            "../../envs/cluster-train.yaml"
        script:
            "../../scripts/train.py"

    # OpenRLHF's TensorBoard scalars as the run's metrics.jsonl, once its last segment has trained.
    rule train_metrics:
        input:
            last_segment,
        output:
            res("runs/{model}/{method}/s{seed}/metrics.jsonl"),
        params:
            run_dir=run_dir,
        log:
            res("logs/train_metrics/{model}/{method}/s{seed}.log"),
        conda:
            "../../envs/cluster-train.yaml"
        script:
            "../../scripts/train_metrics.py"


# Paper scale, filtering baseline (Table 5): every training query's success rate under the initial model,
# sampled with vLLM once per model and shared by the seeds that drop the easiest share.
rule rank_train:
    input:
        train=res("data/train.jsonl"),
    output:
        res("models/{model}/train_success.json"),
    params:
        settings=rank_params,
    log:
        res("logs/rank_train/{model}.log"),
    threads: 1
    resources:
        grading_workers=WORKERS,
        **ENGINE_REQUEST,
    conda:
        "../../envs/cluster-eval.yaml"
    script:
        "../../scripts/rank_train.py"
