# Fresh machine → working environment → run. Every target creates or reuses $(VENV) first.
#   make quickstart   set up, then run experiments/quickstart.yaml on the embedded tiny model
#   make test         set up, then lint (ruff check, ruff format --check) and run the fast test suite
#
# torch: an existing torch in $(VENV) is kept (bring your own CUDA build: `make VENV=/path/to/your/venv ...`);
# otherwise a machine with nvidia-smi gets the default (CUDA) wheel, and a CPU-only machine gets $(TORCH_CPU),
# a CPU build where the package index serves one (pass TORCH_INDEX=<a CPU wheel index URL> elsewhere).

PYTHON ?= python3
VENV ?= .venv
TORCH_CPU ?= torch==2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.harness-installed

.PHONY: setup quickstart test test-all bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already installed: keeping it"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: installing the default torch build"; $(PY) -m pip install --quiet torch; \
	else \
		echo "no GPU: installing $(TORCH_CPU)"; \
		$(PY) -m pip install --quiet "$(TORCH_CPU)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); \
	fi
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/harness run experiments/quickstart.yaml

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n auto --durations=25

test-all: $(STAMP)
	$(PY) -m pytest -q -m ""

bench: $(STAMP)
	$(PY) bench/eval_speed.py

clean:
	rm -rf $(VENV) runs .pytest_cache
