# zerotune — the two commands a new user needs:
#   make run    install if needed, then start the service on http://127.0.0.1:8000 (SQLite, one worker)
#   make test   install if needed, then lint, type-check and run the tests
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The PyTorch to install when none is present. A torch already importable by $(PYTHON) is kept:
# the venv then sees it through --system-site-packages and nothing replaces it.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "zerotune: installing into $(VENV) (first time: about a minute; torch is the largest part)"
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		echo "zerotune: using the existing torch $$($(PYTHON) -c 'import torch; print(torch.__version__)')"; \
		[ -x $(BIN)/python ] || $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV); \
		$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet "$(TORCH_SPEC)"; \
	fi
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --progress-bar off -e ".[dev,deepspeed]"
	@touch $(STAMP)
	@echo "zerotune: installed ($(BIN)/zerotune)"

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install lint
	$(BIN)/python -m pytest

# ZEROTUNE_HOST / ZEROTUNE_PORT (default 127.0.0.1:8000) and every other ZEROTUNE_* setting apply
run: install
	$(BIN)/zerotune serve

bench: install
	$(BIN)/python bench/collectives.py --cluster local:2x2x2 --size-mb 64
	$(BIN)/python bench/trainer_vs_fsdp.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
