"""Weight decay on every parameter (``grid.train.weight_decay_scope: all``, verl's) in OpenRLHF 0.11.2, whose Adam
path exempts biases and norm weights by name and offers no flag for it.

``DeepspeedStrategy._get_model_parameters`` calls ``get_optimizer_grouped_parameters(raw_model, weight_decay)``
through the name ``openrlhf.utils.deepspeed.deepspeed`` imported from ``deepspeed_utils``; the patch rebinds that name
to a wrapper that passes an empty ``no_decay_name_list`` and drops the empty exempt group. ``no_bias_norm`` is
OpenRLHF's own behaviour: no patch. Both scopes' rule is ``calibrl.optim.decay_groups``, which the CPU trainer and the
DLC memory's trainer use.
"""

from __future__ import annotations

import logging
import sys

from calibrl.gpu.patching import Target, when_imported

log = logging.getLogger("calibrl.openrlhf.decay_scope")

MODULE = "openrlhf.utils.deepspeed.deepspeed"
GROUPS = Target(MODULE, "get_optimizer_grouped_parameters")  # the name the caller looks up at call time
CALLER = Target(MODULE, "DeepspeedStrategy._get_model_parameters",
                uses="get_optimizer_grouped_parameters(raw_model, weight_decay)",
                params=("self", "model", "optim", "weight_decay"))  # fmt: skip
DEFINITION = Target("openrlhf.utils.deepspeed.deepspeed_utils", "get_optimizer_grouped_parameters",
                    params=("model", "weight_decay", "no_decay_name_list"))  # fmt: skip
TARGETS = (GROUPS, CALLER, DEFINITION)


def install() -> None:
    """Decay every parameter once OpenRLHF's DeepSpeed strategy module is imported."""
    when_imported(MODULE, patch)


def patch(module) -> None:
    def make(original):
        def get_optimizer_grouped_parameters(model, weight_decay, no_decay_name_list=None):
            groups = original(model, weight_decay, no_decay_name_list=[])
            return [g for g in groups if g["params"]]  # the exempt group is empty: DeepSpeed gets one group

        return get_optimizer_grouped_parameters

    if GROUPS.wrap(sys.modules[MODULE], "decay_scope", make):
        log.info("weight decay on every parameter (scope all) installed on %s", GROUPS)
