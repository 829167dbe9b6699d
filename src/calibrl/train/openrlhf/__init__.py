"""The OpenRLHF backend: paper-scale training with OpenRLHF 0.11.2 (Ray, DeepSpeed, vLLM) on a GPU cluster.

``command.build_command(run)`` turns one (model, method, seed) into the argv of
``python -m calibrl.train.openrlhf.launch``. ``launch`` starts (or joins) Ray with
``iac_patch.apply`` as every worker's setup hook, runs ``openrlhf.cli.train_ppo_ray`` and writes one
``step_{k}.done`` marker per saved Hugging Face checkpoint. ``iac_patch`` puts IAC
(``calibrl.advantages.iac``) into OpenRLHF's advantage computation, ``reward`` is the custom reward
file (binary math-verify correctness through ``calibrl.grading``), ``ray_cluster.sh`` starts a Ray
cluster inside a multi-node SLURM allocation. DLC: ``vllm_dlc`` is the composite policy+memory vLLM model
(registered through the package's ``vllm.general_plugins`` entry point), ``memory_actor`` trains m_phi in a Ray
actor, ``openrlhf_dlc`` hooks both into OpenRLHF; ``dlc`` is the slow Hugging Face generation path.

Nothing here imports OpenRLHF, Ray, DeepSpeed or vLLM at module level, so every module imports on a
CPU machine; the tests check the argv against OpenRLHF's real parser and IAC against its real code.
"""
