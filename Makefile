# The two commands: `make local` and `make test`. Both create .venv when it is missing.
# `make bench` (figures -> docs/benchmarks.md) and `make chaos` (long fault run) are not part of `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: local test lint clean-local bench chaos

$(STAMP): requirements.txt workload/requirements.txt
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

clean-local:
	rm -rf local
