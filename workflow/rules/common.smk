# Validation of the config and the helpers every rule file uses.

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")

RESULTS = config["results"]
TOY_FIGURES = ["fig1", "fig2", "fig3", "fig4", "fig5"]


wildcard_constraints:
    figure="|".join(TOY_FIGURES),


def res(path):
    """A path under the results folder of this config."""
    return f"{RESULTS}/{path}"
