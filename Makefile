# The two commands: `make local` and `make test`. Both create .venv when it is missing.
# `make bench` (figures -> docs/benchmarks.md) and `make chaos` (long fault run) are not part of `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: local test lint check render clean-local bench chaos

$(STAMP): requirements.txt workload/requirements.txt bench/requirements.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed, found " + sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

local: $(STAMP)
	$(PY) -m workload local $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench.run $(ARGS)

chaos: $(STAMP)
	$(PY) -m bench.chaos $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

# Static checks alone (make test runs them too): ruff, yamllint, hadolint, manifests, policy pack.
check: $(STAMP)
	$(PY) -m pytest -q tests/policy tests/infra/test_infra_manifests.py

# Offline render of one stack under the SDK mocks: manifests + inventory in build/render/$(STACK),
# then the policy pack's result (exit 1 on a mandatory violation). No credentials needed.
STACK ?= dev
render: $(STAMP)
	$(PY) -m policy.offline $(STACK)

clean-local:
	rm -rf local
