# Hub models: each downloaded once, on the login node (compute nodes are often offline), at its pinned revision
# (grid.models.<name>.revision) into the shared grid.models_dir. The jobs that read a model get its absolute folder
# (calibrl.grid.model_path) and run with HF_HUB_OFFLINE=1; the output records the folder, the revision and the commit
# it resolved to (calibrl.model_store). Which file a run's model comes from (this rule's, or a tiny model's warm
# start) is its backend's (calibrl.backends: model_file).


rule download_model:
    output:
        res("models/{model}/hub.json"),
    params:
        model=download_params,
    log:
        res("logs/download_model/{model}.log"),
    localrule: True  # the login node: the one with the Hub
    retries: 2  # the Hub is flaky; offline it fails at once, naming the folder to pre-seed
    conda:
        "../../envs/local.yaml"
    script:
        "../../scripts/download_model.py"


# Every model the grid's runs train from, prepared first (a DLC run's memory model included; a warm start per data seed).
MODEL_INFOS = [res(f) for f in G.model_files(config)]


# On a GPU backend: what the grid costs, printed by the Snakemake that plans it (a dry run included; never by the
# jobs it submits), with a warning for each rule whose estimated job outruns its runtime in the profile.
if BACKEND.gpu is not None and workflow.is_main_process:
    from calibrl import plan as P

    _rows, _trains = P.plan(config)
    _limits = {}  # minutes per rule, where the profile's set-resources gives a plain number
    for _rule, _res in workflow.resource_settings.overwrite_resources.items():
        _runtime = getattr(_res.get("runtime"), "value", _res.get("runtime"))
        if isinstance(_runtime, (int, float)):
            _limits[_rule] = float(_runtime)
    _lines = [
        f"SLURM jobs' venv: {GPU_VENV} (CALIBRL_GPU_VENV)",
        "calibrl plan (estimate; every run, each assumption with its source: calibrl plan --configfile ...):",
        P.render(_rows, _trains, brief=True),
        *P.check_runtimes(_rows, _limits),
    ]
    logger.info("\n".join(_lines))
