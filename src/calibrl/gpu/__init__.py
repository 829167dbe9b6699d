"""What every paper-scale (GPU) backend can share, and none of it is a trainer's: the guard for patching a pinned
library (``patching``), DLC's composite vLLM model (``vllm_dlc``, the ``vllm.general_plugins`` entry point
registers it), DLC's memory trainer (``memory_actor``: one FSDP rank; ``memory_group``: its Ray actors), padding-free
micro-batches (``packing``), a private Ray cluster over a SLURM allocation (``ray_cluster.sh``, ``ray_node_ip.py``)
and the grading a rollout's reward comes from (``reward``).

It imports the algorithm core and libraries, never a backend (pyproject.toml's import contracts): a backend
(``calibrl.backends.<name>``) adapts these to its trainer's API, as OpenRLHF's folder does.
"""

from pathlib import Path

RAY_CLUSTER = Path(__file__).resolve().with_name("ray_cluster.sh")  # bash RAY_CLUSTER COMMAND...: see its header
