# muxflow — `make run` runs the main job, `make test` runs the tests. Both set up
# the virtual environment first (fresh clone → working in one command).
SHELL := /bin/bash
# A Python every user can run (jobs run the venv's workloads as their owners, the service account runs
# Dagster from it): .ci/pick_python.sh; PYTHON=… to choose.
PYTHON ?= $(shell bash .ci/pick_python.sh)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The Dagster instance `make run` writes and `make ui` reads.
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
UI_PORT ?= 3000

.PHONY: install run ui test test-slurm-compat test-gpu gpu-check bench clean

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

# The Dagster UI on the instance and store of the last `make run`: runs, round
# partitions of placement_plan and their metadata.
ui: install
	@test -f "$(DAGSTER_HOME)/muxflow.json" || echo "note: no $(DAGSTER_HOME)/muxflow.json yet; run 'make run' first to have rounds to look at"
	$(VENV)/bin/dagster-webserver -w workspace.yaml -h 127.0.0.1 -p $(UI_PORT)

# xCUDA, the LD_PRELOAD library, its fake driver, harness and C unit tests (executors/node/xcuda/build/).
.PHONY: xcuda
xcuda:
	$(MAKE) -C executors/node/xcuda

# The tests never read the user's instance: whatever the checkout holds (`make run`'s .dagster_home/muxflow.json
# and .muxflow/) and whatever the shell exports, they run with DAGSTER_HOME a fresh, empty folder of their own and
# none of the deployment's settings variables (MUXFLOW_SETTINGS, MUXFLOW_DATABASE_URL, MUXFLOW_CLUSTER, …, SLURM_CONF:
# pipelines.settings.environment_variables); each test names its own store and settings.
TEST_DAGSTER_HOME := $(CURDIR)/test-artifacts/dagster_home
TEST_ENV = rm -rf "$(TEST_DAGSTER_HOME)" && mkdir -p "$(TEST_DAGSTER_HOME)" \
	&& settings_vars=$$($(PY) -c 'from pipelines.settings import environment_variables as v; print(*v())') \
	&& unset $$settings_vars && export DAGSTER_HOME="$(TEST_DAGSTER_HOME)" &&

# The dev Slurm cluster is brought up for the tests and taken down after them if it
# was not running before (.ci/with_slurm.sh); pytest's exit status is make's.
# PYTEST_ARGS=… narrows the run (e.g. PYTEST_ARGS=tests/live).
# The suite runs in TEST_WORKERS pytest-xdist workers (2 to 4, by the CPUs): the tests of tests/live and tests/ui, which
# mostly wait on the daemons they drive, run in order in one of them while the others take the rest
# (tests/conftest.py). TEST_WORKERS=0 runs everything in one process. The run ends with its 25 slowest tests.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$n)
test: install xcuda
	bash .ci/ensure_postgres.sh
	bash .ci/ensure_browser.sh
	bash .ci/ensure_prometheus.sh
	$(TEST_ENV) bash .ci/with_slurm.sh $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# The live Slurm tests of sites' concerns (users, versions, node faults) on Slurm 24.11 from Debian 13, in a
# debootstrap tree cached under /var/cache/muxflow (built once, ~1 min; docs/SLURM.md "Slurm 24.11").
# `make test` runs the same tests on the host's Slurm 22.05.
SLURM_COMPAT_TESTS := tests/live/test_site_users_live.py tests/live/test_rest_versions_live.py tests/live/test_security_live.py \
	tests/live/test_site_faults_live.py tests/live/test_job_attacks_live.py
test-slurm-compat: install
	$(TEST_ENV) MUXFLOW_SLURM_RELEASES=24.11 bash .ci/with_slurm.sh $(PY) -m pytest -q $(SLURM_COMPAT_TESTS)

# NVML node-agent tests on a GPU node (fail, not skip, if the driver is missing).
test-gpu: install
	$(TEST_ENV) MUXFLOW_REQUIRE_GPU=1 $(PY) -m pytest -q -rs tests/gpu

# The GPU path proved on a lent GPU machine as it comes: no venv, no network, no database (docs/GPU.md). xCUDA is
# built, then each part runs with its deadline and writes its results as it goes, into $(GPU_CHECK_OUT) (the device
# tool's $$OUT where set): at most 8 files, summary.json and SUMMARY.md first. Eight minutes at most.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_OUT ?= $(if $(OUT),$(OUT),gpu-check-results)
gpu-check:
	$(MAKE) -s -C executors/node/xcuda
	$(GPU_PYTHON) -m executors.dev.gpu_check --out "$(GPU_CHECK_OUT)" $(GPU_CHECK_ARGS)

bench: install
	$(VENV)/bin/muxflow bench round

clean:
	rm -rf .muxflow .dagster_home .pytest_cache .hypothesis test-artifacts
