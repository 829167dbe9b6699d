"""AdamW's parameter groups for a weight-decay scope (``grid.train.weight_decay_scope``), one rule for every trainer.

``all`` decays every trainable parameter (verl's FSDP workers, the paper's framework, build AdamW on
``model.parameters()``); ``no_bias_norm`` exempts, by name, what OpenRLHF 0.11.2's Adam path exempts
(``openrlhf.utils.deepspeed.deepspeed_utils.get_optimizer_grouped_parameters``'s ``no_decay_name_list``): in a Qwen3,
the RMSNorm weights (it has no biases).
"""

from __future__ import annotations

SCOPES = ("all", "no_bias_norm")
NO_DECAY = ("bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight")  # OpenRLHF 0.11.2's list


def decay_groups(model, weight_decay: float, scope: str) -> list[dict]:
    """Parameter groups for ``torch.optim.AdamW``: the decayed at ``weight_decay``, the exempt (if any) at 0."""
    if scope not in SCOPES:
        raise ValueError(f"weight decay scope {scope!r}: expected one of {SCOPES}")
    decayed, kept = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            exempt = scope == "no_bias_norm" and any(x in name for x in NO_DECAY)
            (kept if exempt else decayed).append(p)
    groups = [{"params": decayed, "weight_decay": weight_decay}]
    return groups + ([{"params": kept, "weight_decay": 0.0}] if kept else [])
