"""``VERL_USE_EXTERNAL_MODULES`` of a CPU rehearsal's processes that belong to no run (the preflight's probe of the
training engine, ``GpuSide.rollout_engine``'s ``env``): the CPU platform and its stand-ins, which a run's processes get
from ``external``."""

from calibrl.backends.verl import cpu_platform

cpu_platform.install()
