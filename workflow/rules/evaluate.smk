# Evaluation: n samples per problem on every evaluation split, graded, one result file per checkpoint
# (calibrl.evaluate.evaluate_job), as soon as the segment that trains the checkpoint is done. One job per checkpoint,
# as each needs its own GPU allocation at paper scale; a run extended or resumed later then only evaluates its new
# checkpoints, and a changed evaluation setting reruns evaluations, never training.
# The segment marker is ancient(): a checkpoint never changes once written (training resumes from it and never
# rewrites it), so a training job that resumes and rewrites its markers does not re-evaluate old checkpoints. A
# retrained run is another matter: the run's settings.json (not ancient) changes with its settings or inputs, so its
# evaluations rerun exactly then; a job refuses a checkpoint whose marker names another fingerprint than
# settings.json's.


rule evaluate:
    input:
        trained=ancient(trained_checkpoint),
        splits=eval_splits,
        settings=run_settings,
        preflight=preflight_gate(lambda w: ENGINE_REQUEST),
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
        EVAL_ENV
    script:
        "../../scripts/evaluate.py"


# The base model the runs of {model} with seed {seed} start from (its data seed's warm start), evaluated as step 0
# with seed {seed}'s sampling stream (the stream that seed's checkpoints use), so the over-sharpening claims compare
# each seed's runs with the base on common samples. Its identity is the model's info file and the evaluation settings; "base" is no method's name.
rule evaluate_base:
    input:
        model=lambda w: res(BACKEND.model_file(w.model, G.data_seed(config, int(w.seed)))),
        splits=eval_splits,
        preflight=preflight_gate(lambda w: ENGINE_REQUEST),
    output:
        res("runs/{model}/base/s{seed}/eval/step_0.json"),
    params:
        settings=lambda w: G.base_params(config, int(w.seed)),
        split_names=EVAL_SPLITS,
    log:
        res("logs/evaluate/{model}/base/s{seed}/step_0.log"),
    threads: 1
    resources:
        grading_workers=WORKERS,
        **ENGINE_REQUEST,
    conda:
        EVAL_ENV
    script:
        "../../scripts/evaluate_base.py"
