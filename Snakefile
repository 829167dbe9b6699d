# calibrl: reproduce "When Sharpening Becomes Collapse" (arXiv 2601.15609).
#
#   snakemake --cores 2             the embedded default (config/config.yaml), CPU only
#   snakemake --cores 2 toy         only the softmax experiments (Figures 1-5)
#   snakemake --report results/report.html   the self-contained report of a finished run
#
# Rules live in workflow/rules/, logic in the calibrl package (src/calibrl).

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/toy.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.toy.input,
        rules.aggregate.output,
        rules.grid_mlflow.output,
