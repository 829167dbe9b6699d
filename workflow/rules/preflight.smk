# The preflight (calibrl.preflight): before any GPU job of a request shape runs, one job of that shape on the GPU
# partition, in the jobs' environment, checks what they need (GPUs, driver, compiler, flash-attn, DeepSpeed's
# optimizer, a vLLM engine, Ray across the nodes, the locked models, disk, the run lock) and fails in minutes,
# naming each cause and its fix. A GPU job waits for its shape's preflight only while its own output is missing:
# a finished job never reruns because a preflight ran again (`--forcerun preflight` re-checks a site).

rule preflight:
    input:
        MODEL_INFOS,
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
