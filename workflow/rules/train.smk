# Training: the run's identity (settings.json), then its training in segments, each one job that resumes from the
# previous segment's checkpoint; what a run trains from and what a job asks SLURM for are its backend's
# (calibrl.backends: the CPU trainer warm-starts tiny models and trains one checkpoint per job; OpenRLHF trains Hub models
# in SLURM-sized segments of grid.models.<model>.resources.segment_steps). Weights live under ckpt/ undeclared, so
# a failed job keeps them and resumes; Snakemake tracks the small segment markers. Checkpoints are stamped with the
# fingerprint of the run's settings.json: a job whose settings changed sets the old ones aside and trains from
# scratch (calibrl.checkpoints).


# A backend's warm-started model (Backend.warmstart; the CPU backend's: supervised fine-tuning of a fresh tiny Qwen3
# on data seed {data}'s sft problems, disjoint from RL's and the test's, initialised with that seed). Hub models
# need none.
rule warmstart:
    input:
        sft=res("data/d{data}/sft.jsonl"),
    output:
        model=directory(res("models/{model}/d{data}/init")),
        info=res("models/{model}/d{data}/init.json"),
    params:
        settings=warmstart_params,
    log:
        res("logs/warmstart/{model}/d{data}.log"),
    threads: 1
    priority: 20  # the head of the longest chain (warm start -> training -> evaluation): start it first
    conda:
        BACKEND.env
    script:
        "../../scripts/warmstart.py"


# The run's identity: its config slice (with the compiled method) and the digests of its inputs
# (calibrl.checkpoints.stamp), and beside them where the inputs are and how the run is laid out: the only thing a
# backend reads. Training and evaluation read it, so a changed setting or input reruns both; a resumed run reruns
# neither.
rule run_settings:
    input:
        unpack(run_inputs),
    output:
        res("runs/{model}/{method}/s{seed}/settings.json"),
    params:
        settings=train_params,
        resources=run_resources,
    log:
        res("logs/run_settings/{model}/{method}/s{seed}.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/run_settings.py"


# One segment of a run: up to step {end}. A checkpoint's evaluation waits for the
# segment that trains it, so at paper scale a segment's checkpoints are evaluated while the next one trains.
rule train:
    input:
        unpack(run_inputs),
        settings=run_settings,
        previous=previous_segment,
        preflight=preflight_gate(train_request),
    output:
        res("runs/{model}/{method}/s{seed}/ckpt/segment_{end}.done"),
    params:
        end=lambda wildcards: int(wildcards.end),
    log:
        res("logs/train/{model}/{method}/s{seed}/segment_{end}.log"),
    threads: 1
    resources:
        grading_workers=WORKERS,
        nodes=lambda wildcards: train_request(wildcards).get("nodes", 1),
        gres=lambda wildcards: train_request(wildcards).get("gres", ""),
    priority: 10  # longer than evaluations: with a fixed number of cores, long jobs first finish soonest
    conda:
        BACKEND.env
    script:
        "../../scripts/train.py"


# The run's training metrics (per step) as metrics.jsonl, once its last segment has trained.
rule train_metrics:
    input:
        last_segment,
        settings=run_settings,
    output:
        res("runs/{model}/{method}/s{seed}/metrics.jsonl"),
    log:
        res("logs/train_metrics/{model}/{method}/s{seed}.log"),
    localrule: True
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/train_metrics.py"


# Table 5's filtering baseline at paper scale: every training query's success rate under the initial model, sampled
# with the evaluator's engines once per model and shared by the seeds that drop the easiest share (the CPU trainer
# ranks its queries in the training job itself).
rule rank_train:
    input:
        train=res(f"data/d{GRID['data']['seed']}/train.jsonl"),
        preflight=preflight_gate(lambda w: ENGINE_REQUEST),
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
