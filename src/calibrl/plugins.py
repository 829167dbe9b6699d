"""The package's vLLM plugins (``vllm.general_plugins`` entry points, pyproject.toml) as this code declares them,
and a check of those the environment has installed.

vLLM calls every installed plugin in every process it starts, without a guard around the call, so an install made
before the entry points changed (an editable install keeps the ones it was made with) fails every engine, or leaves
DLC's model unregistered. :func:`check` says so, with the fix, before an engine starts: in the preflight's ``vllm``
check, the evaluator's engines and the OpenRLHF launcher."""

from __future__ import annotations

VLLM_PLUGINS = {
    "calibrl_dlc": "calibrl.gpu.vllm_dlc:register",  # DLC's composite model
    "calibrl_backends": "calibrl.backends.vllm_plugin:plugin",  # a run's vLLM processes, to its backend
}
FIX = (
    "reinstall calibrl in this environment: pip install -e <the checkout> (the cluster's GPU venv: "
    "scripts/cluster_env.sh build; a Snakemake conda environment: remove it under .snakemake/conda/ and rerun)"
)


class StalePlugins(RuntimeError):
    """The installed entry points are not this code's: ``cause`` says how, the message adds :data:`FIX`."""

    def __init__(self, cause: str):
        super().__init__(f"{cause}; {FIX}")
        self.cause = cause


def installed() -> dict[str, str]:
    """calibrl's ``vllm.general_plugins`` entry points as installed here (name -> ``module:function``)."""
    from importlib.metadata import entry_points

    found = entry_points(group="vllm.general_plugins")
    return {ep.name: ep.value for ep in found if ep.dist is not None and ep.dist.name == "calibrl"}


def check() -> None:
    """Raise :class:`StalePlugins` unless the installed plugins are :data:`VLLM_PLUGINS`."""
    have = installed()
    if have != VLLM_PLUGINS:
        raise StalePlugins(f"calibrl's vLLM plugins installed here are {have or 'none'}, its code's {VLLM_PLUGINS}")
