"""The algorithm core: every formula of the methods once, each citing the paper or the recipe it follows.

``advantages`` (estimators and IAC), ``losses`` (policy loss, KL, aggregation), ``dapo`` (shaping, dynamic
sampling), ``dlc`` (calibrated logits, memory loss), ``filtering`` (Table 5's baseline), over the named
``registry`` they are selected through. It imports nothing of the project above it, and torch only inside the
functions that compute: importing a module registers its names and needs no torch, so the config check
(``calibrl.config.registry_enums``, at every Snakefile load) reads the registries without paying torch's import.
"""
