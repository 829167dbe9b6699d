# Evaluation: n samples per problem on every evaluation split, graded, one result file per checkpoint.
# CPU trainer and CPU evaluator (INLINE_EVAL, the embedded default): the training job evaluates its checkpoints
# once trained (rule train, same code: calibrl.evaluate.evaluate_job), so the seconds of start-up (torch,
# transformers) are paid once per run; each checkpoint's result is the one it gets when evaluated alone.
# vLLM evaluator (paper scale), or grid.eval.per_checkpoint: this rule, one job per checkpoint, as each needs its
# own GPU allocation; a run extended or resumed later then only evaluates its new checkpoints.
# At paper scale the rule waits for the training segment that makes the checkpoint (rule train, one job per
# segment), so a segment's checkpoints are evaluated while the next one trains.
# Markers are ancient(): a checkpoint never changes once written (training resumes from it and never
# rewrites it), so a training job that resumes and rewrites its markers does not re-evaluate old checkpoints.
# A retrained run is another matter: the run's settings.json (not ancient) changes with its settings or
# inputs, so its evaluations rerun exactly then; a job refuses a checkpoint whose marker names another
# fingerprint than settings.json's.

if not INLINE_EVAL:

    rule evaluate:
        input:
            trained=ancient(trained_checkpoint),
            splits=expand(res("data/{split}.jsonl"), split=EVAL_SPLITS),
            settings=run_settings,
        output:
            res("runs/{model}/{method}/s{seed}/eval/step_{step}.json"),
        params:
            settings=EVAL_PARAMS,
            split_names=EVAL_SPLITS,
            steps=lambda wildcards: [int(wildcards.step)],
        log:
            res("logs/evaluate/{model}/{method}/s{seed}/step_{step}.log"),
        threads: 1
        resources:
            grading_workers=WORKERS,
            **ENGINE_REQUEST,
        conda:
            "../../envs/local.yaml" if GRID["evaluator"] == "local" else "../../envs/cluster-eval.yaml"
        script:
            "../../scripts/evaluate.py"
