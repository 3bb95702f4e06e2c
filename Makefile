# Set-up and checks. `make demo` and `make test` work on a fresh clone with nothing installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch: pinned here so pip never pulls the multi-GB CUDA wheel; users on a
# GPU install their own torch (pyproject only asks for torch>=2.6).
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint format clean install install-dev

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

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/rlvr demo

test: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests
	$(BIN)/python -m pytest -q

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(VENV)/.installed-dev
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
