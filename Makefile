# muxflow — `make run` runs the main job, `make test` runs the tests. Both set up
# the virtual environment first (fresh clone → working in one command).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# A CPU build of torch first where this machine offers one, so the range in
	@# pyproject.toml is already met and pip never pulls a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0" || true
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(VENV)/bin/muxflow run --fresh

test: install
	bash .ci/ensure_postgres.sh
	$(PY) -m pytest -q

bench: install
	$(VENV)/bin/muxflow bench round

clean:
	rm -rf .muxflow .pytest_cache .hypothesis
