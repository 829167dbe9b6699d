# Data: the synthetic countdown task of the embedded default (train, in-distribution test, harder ood), one set of
# problems per data seed (d{data}: the analysis plan's, calibrl.analysis_plan, and grid.data.seed), or, at paper
# scale, DeepScaleR and the six benchmarks from the Hugging Face Hub (one data seed, grid.data.seed). One job per
# split, so a changed split (its size, its revision) remakes that file alone.

if GRID["data"]["source"] == "countdown":

    rule data_synthetic:
        output:
            data=res("data/d{data}/{split}.jsonl"),
            manifest=res("data/d{data}/{split}.manifest.json"),
        params:
            data=data_params,
        log:
            res("logs/data/d{data}/{split}.log"),
        priority: 30  # everything but the toy waits for it
        conda:
            "../../envs/local.yaml"
        script:
            "../../scripts/data_synthetic.py"

else:

    rule data_download:
        output:
            data=res("data/d{data}/{split}.jsonl"),
            manifest=res("data/d{data}/{split}.manifest.json"),
        params:
            data=data_params,
        log:
            res("logs/data/d{data}/{split}.log"),
        localrule: True  # compute nodes often have no internet
        retries: 2  # the Hub is flaky; offline it fails at once with a clear message
        conda:
            "../../envs/local.yaml"
        script:
            "../../scripts/data_download.py"
