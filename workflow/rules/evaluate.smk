# Evaluation: n samples per problem on every evaluation split, graded, one result file per checkpoint.
# CPU evaluator: one job per run evaluates all of its checkpoints (they appear together when the training
# job ends), so the 5-10 s of per-job start-up (torch, transformers, grading workers) is paid once per run,
# not once per checkpoint; each checkpoint's result is the same as when it is evaluated alone.
# vLLM evaluator (paper scale), or grid.eval.per_checkpoint: one job per checkpoint, as each needs its own
# GPU allocation; a run extended or resumed later then only evaluates its new checkpoints.
# Markers are ancient(): a checkpoint never changes once written (training resumes from it and never
# rewrites it), so a training job that resumes and rewrites its markers does not re-evaluate old checkpoints.
# A retrained run is another matter: the run's settings.json (not ancient) changes with its settings or
# inputs, so its evaluations rerun exactly then; a job refuses a checkpoint whose marker names another
# fingerprint than settings.json's.

if GRID["evaluator"] == "local" and not GRID["eval"].get("per_checkpoint", False):

    rule evaluate:
        input:
            markers=ancient(
                expand(res("runs/{{model}}/{{method}}/s{{seed}}/ckpt/step_{step}.done"), step=EVAL_STEPS)
            ),
            splits=expand(res("data/{split}.jsonl"), split=GRID["data"]["eval_splits"]),
            settings=run_settings,
        output:
            expand(res("runs/{{model}}/{{method}}/s{{seed}}/eval/step_{step}.json"), step=EVAL_STEPS),
        params:
            settings=EVAL_PARAMS,
            split_names=GRID["data"]["eval_splits"],
            steps=EVAL_STEPS,
        log:
            res("logs/evaluate/{model}/{method}/s{seed}.log"),
        threads: 1
        resources:
            grading_workers=WORKERS,
        conda:
            "../../envs/local.yaml"
        script:
            "../../scripts/evaluate.py"

else:

    rule evaluate:
        input:
            markers=ancient(res("runs/{model}/{method}/s{seed}/ckpt/step_{step}.done")),
            splits=expand(res("data/{split}.jsonl"), split=GRID["data"]["eval_splits"]),
            settings=run_settings,
        output:
            res("runs/{model}/{method}/s{seed}/eval/step_{step}.json"),
        params:
            settings=EVAL_PARAMS,
            split_names=GRID["data"]["eval_splits"],
            steps=lambda wildcards: [int(wildcards.step)],
        log:
            res("logs/evaluate/{model}/{method}/s{seed}/step_{step}.log"),
        threads: 1
        resources:
            grading_workers=WORKERS,
        conda:
            "../../envs/local.yaml" if GRID["evaluator"] == "local" else "../../envs/cluster-eval.yaml"
        script:
            "../../scripts/evaluate.py"
