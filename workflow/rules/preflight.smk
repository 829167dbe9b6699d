# The preflight (calibrl.preflight): before any GPU job of a request shape runs, one job of that shape on the GPU
# partition, in the jobs' environment, checks what they need (GPUs, driver, compiler, flash-attn's kernel,
# DeepSpeed's optimizer, vLLM engines started as the shape's jobs start them: OpenRLHF's rollout engine with its
# worker extension, sleep mode, TP and DLC's composite for training shapes, the evaluator's for evaluation; Ray
# across the nodes with GPU actors and an NCCL all-reduce between them, the locked models, disk and quotas, the run
# lock, and the backend's training canary: each kind of run trains 2 steps, saves and resumes) and fails, naming each
# cause and its fix. Its params are PF.params: the slice of the config those
# checks read (the engines are derived from the grid's layouts). Every GPU job has its shape's preflight as an
# ancient input (common.smk, preflight_gate): a finished job never reruns because a preflight ran again
# (`--forcerun preflight` re-checks a site).

rule preflight:
    input:
        MODEL_INFOS,
        canary=lambda wildcards: [res(path) for path in PF.inputs(config, wildcards.shape)],
    output:
        res("preflight/{shape}.json"),
    params:
        settings=lambda wildcards: PF.params(config, wildcards.shape),
    log:
        res("logs/preflight/{shape}.log"),
    threads: 1
    resources:
        nodes=lambda wildcards: PREFLIGHT[wildcards.shape]["nodes"],
        gres=lambda wildcards: PREFLIGHT[wildcards.shape]["gres"],
    priority: 30  # first: every GPU job of its shape waits for it
    retries: 0  # what it finds does not go away by itself
    conda:
        BACKEND.env
    script:
        "../../scripts/preflight.py"
