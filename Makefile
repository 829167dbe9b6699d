# make run   : create .venv, install, run the embedded default (snakemake --cores 2)
# make test  : create .venv, install, run the test suite (ruff and snakemake --lint included)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: run test toy lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch==2.13.0 first: the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The OpenRLHF tests import the real 0.11.2 package on CPU; its GPU stack (vLLM, DeepSpeed, flash-attn)
	# is not needed for that and would pull CUDA builds, hence --no-deps (its few pure-Python imports first).
	$(BIN)/python -m pip install --quiet accelerate peft pylatexenc
	$(BIN)/python -m pip install --quiet --no-deps openrlhf==0.11.2
	touch $@

run: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES)

toy: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES) toy

test: $(VENV)/.installed
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

clean:
	rm -rf results/* .snakemake
