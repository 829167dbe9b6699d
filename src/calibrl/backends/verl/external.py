"""What every process of a verl run imports first: verl runs ``VERL_USE_EXTERNAL_MODULES`` at ``import verl``
(verl/__init__.py), in the driver, the TaskRunner, the FSDP workers, the reward workers and vLLM's engine processes
(whose worker extension imports verl). The launcher names this module there and passes the run's settings.json
(``CALIBRL_SETTINGS``) to every Ray worker.

It registers, in each process, from the run's settings:

* the CPU platform and its stand-ins, on a CPU rehearsal only (``cpu_platform``);
* the IAC advantage estimators, in verl's estimator registry (``advantage.register``);
* the run's trainer mode, once verl's v1 trainers are imported (``trainer.register``, lazily: most processes never
  import the trainers).
"""

from __future__ import annotations

import os

from calibrl.checkpoints import SETTINGS_ENV, RunStamp
from calibrl.gpu.patching import when_imported

MODULE = __name__
TRAINERS = "verl.trainer.ppo.v1.trainer_sync"


def _install() -> None:
    path = os.environ.get(SETTINGS_ENV)
    if not path:
        raise RuntimeError(f"{MODULE} is loaded by VERL_USE_EXTERNAL_MODULES but {SETTINGS_ENV} is not set: the "
                           "verl backend's launcher passes both to every process of a run")  # fmt: skip
    stamp = RunStamp.read(path)
    if (stamp.resources or {}).get("cpu_rehearsal"):
        from calibrl.backends.verl import cpu_platform

        cpu_platform.install()
    from calibrl.backends.verl import advantage, trainer

    advantage.install(float(stamp.method.iac_alpha))
    advantage.register()
    when_imported(TRAINERS, lambda module: trainer.register())


_install()
