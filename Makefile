# The two commands: `make local` and `make test`. Both create .venv when it is missing.
# `make local` installs only what the worker needs (requirements-local.txt); `make test` everything
# (requirements.txt). `make bench` (figures -> docs/benchmarks.md) and `make chaos` (long fault run) are
# not part of `make test`, but their miniatures are (tests/test_bench_mini.py, tests/chaos/), so neither
# breaks unnoticed. `make preview STACK=dev` is `pulumi preview` with the policy pack.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCAL_STAMP := $(VENV)/.installed-local
# The Pulumi program's own virtualenv (Pulumi.yaml names it): `make render|diff|preview` install the program's and
# the pack's packages there, never into .venv, whose worker packages want another protobuf than pulumi-policy.
INFRA_VENV := build/infra-venv
INFRA_STAMP := $(INFRA_VENV)/.installed-infra
ALL_STAMP := $(VENV)/.installed-all
POLICY_VENV := policy/venv
POLICY_STAMP := $(POLICY_VENV)/.installed
# Where the environment sets PYTHONDONTWRITEBYTECODE (this project's machines do), every process compiled what it
# imported from source again: this repository's modules in each of the tests' worker processes (~50 s of CPU a
# suite, py-spy), and with .venv installed --no-compile, torch and pulumi_gcp in every interpreter (6.9 s vs
# 2.8 s). Emptied, each module is compiled once into its __pycache__ (git-ignored here; inside the venvs).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: local test chromium pulumi-cli lint check render diff preview clean-local bench chaos mutation planted

# The first install into a venv shows pip's progress (torch alone is hundreds of MB); later ones are quiet.
# $(1): requirements file, $(2): venv, $(3): more pip flags.
define pip_install
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is needed, found " + sys.version.split()[0])'
	@test -x $(2)/bin/python || $(PYTHON) -m venv $(2)
	@quiet=$$(ls $(2)/.installed* >/dev/null 2>&1 && echo --quiet); \
	  set -x; $(2)/bin/python -m pip install $$quiet --upgrade pip && $(2)/bin/python -m pip install $$quiet $(3) -r $(1)
endef

# --no-compile (.venv): no bytecode for every module of torch, sympy, pandas and pulumi_gcp up front; Python
# compiles what a command imports on its first import and keeps it (PYTHONDONTWRITEBYTECODE is emptied above).
# Measured here from a fresh clone: `make test`'s venv took 149 s with pip's compilation, 71 s without. The Pulumi
# program's and the policy pack's venvs keep pip's compilation: `pulumi` runs their interpreters outside make, in
# the user's environment, where PYTHONDONTWRITEBYTECODE may be set.
$(LOCAL_STAMP): requirements-local.txt workload/requirements.txt
	$(call pip_install,requirements-local.txt,$(VENV),--no-compile)
	@touch $@

$(INFRA_STAMP): infra/requirements.txt policy/requirements.txt
	$(call pip_install,infra/requirements.txt -r policy/requirements.txt,$(INFRA_VENV))
	@touch $@

$(ALL_STAMP): requirements.txt requirements-local.txt requirements-test.txt workload/requirements.txt \
		infra/requirements.txt policy/requirements.txt bench/requirements.txt
	$(call pip_install,requirements.txt,$(VENV),--no-compile)
	@touch $@ $(LOCAL_STAMP)

$(POLICY_STAMP): policy/requirements.txt
	$(call pip_install,policy/requirements.txt,$(POLICY_VENV))
	@touch $@

local: $(LOCAL_STAMP)
	$(PY) -m workload local $(ARGS)

# Three pytest processes (pytest-xdist), one test file each at a time (--dist loadfile keeps a module's
# fixtures in one process): most tests wait on leases and worker subprocesses, so two processes left the 2 cores
# idle between waits. From a fresh clone on the 2-core CI machine, idle: 10 min 36 s of pytest with 2, 8 min 39 s
# with 3 (CPU 90-98 % busy), 1960 tests passing both ways. Since the round of issues 33-37 (2,294 tests): 16 min 43 s
# with 3 (28.6 min of CPU: both cores busy, so more processes would not help); the next round (2,371 tests):
# 16 min 32 s, 28.1 min of CPU; the round after (2,417 tests): 15 min 27 s of pytest, 17 min 37 s with the .venv
# made from scratch, 31.2 min of CPU in all. Since the tests fork their worker processes from a zygote that imported
# torch once (tests/workload/zygote.py; ~4-5 s of CPU a worker saved): 10 min 45 s to 11 min 26 s of pytest in three
# runs, 20-21.6 min of CPU, both cores busy ~94 % of the time (TEST_JOBS=4: 11 min 8 s, more CPU). TEST_JOBS=0 runs it in this process.
# tests/conftest.py puts the files that take minutes first (loadfile hands files out in collection order), and the
# simulated dataset and reference run of tests/workload are built once for all processes. --dist loadgroup or load
# would pay each module fixture (make local's run, the benchmarks' miniature: over a minute each) in every process.
# With PYTHONDONTWRITEBYTECODE emptied (above), the Pulumi.yaml parse cached and the zygote preloading matplotlib:
# 691 s of pytest -> 620 s -> 565 s, idle, here (2,425 tests, 2026-11-28). With .venv --no-compile, from a fresh
# clone: 46 s of venv + 592 s of pytest (its first imports compile), 10 min 39 s in all, against 149 s + 565 s before.
TEST_JOBS ?= 3
test: $(ALL_STAMP) $(if $(filter true,$(CI)),chromium)
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# The HTML report's browser test (tests/workload/test_report_page.py) opens report.html in a real headless
# Chromium. Under CI=true `make test` installs it from Debian's packages when it is missing (CI runs as root
# with the registry reachable) and the test fails without it; elsewhere the test skips, saying why.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "chromium is missing: installing it from Debian's packages (apt-get install chromium) for the HTML report's browser test"; \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends \
	      chromium; } >/tmp/apt-chromium.log 2>&1 \
	    || { echo "could not install chromium (apt-get's log: /tmp/apt-chromium.log):"; tail -5 /tmp/apt-chromium.log; exit 1; }; \
	  echo "chromium installed: $$(chromium --version 2>/dev/null | head -1)"; }

bench: $(ALL_STAMP)
	$(PY) -m bench.run $(ARGS)

chaos: $(ALL_STAMP)
	$(PY) -m bench.chaos $(ARGS)

# Mutation testing of the core (mutmut, about an hour on 2 cores; not part of `make test`): score per module and
# every surviving mutant; ARGS="--only metrics policy" for a part, ARGS=--write to record it in docs/benchmarks.md (explained survivors: bench/mutation_explained.md);
# a partial run's --write replaces only its groups' figures, each group's row naming the commit it was measured at;
# ARGS="--changed-since recorded --write": only the groups changed since their own recorded commit (or never measured).
mutation: $(ALL_STAMP)
	nice -n 19 $(PY) -m bench.mutation $(ARGS)

# The bugs issue 13 names, planted one at a time in a copy of the checkout (bench/planted.py): each must make
# one of its named tests fail (several minutes; not part of `make test`). ARGS="--only 1 3a", ARGS=--list.
planted: $(ALL_STAMP)
	nice -n 10 $(PY) -m bench.planted $(ARGS)

lint: $(ALL_STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache

# Static checks alone (make test runs them too): ruff, yamllint, hadolint, manifests, policy pack.
check: $(ALL_STAMP)
	$(PY) -m pytest -q tests/policy tests/infra/test_infra_manifests.py

# Offline render of one stack under the SDK mocks: manifests + inventory in build/render/$(STACK),
# then the policy pack's result (exit 1 on a mandatory violation). No credentials needed; a stack
# without stacks/Pulumi.$(STACK).yaml renders with the Pulumi.yaml defaults. Config overrides:
# make render STACK=dev ARGS='datasetUri=gs://my-bucket/fraud outputUri=gs://my-bucket/out'
STACK ?= dev
render: $(INFRA_STAMP)
	$(INFRA_VENV)/bin/python -m policy.offline $(STACK) $(ARGS)

# What a config change would replace, before `pulumi up`: the stack rendered as configured and with ARGS,
# compared under mocks with the providers' replace-on-change facts (infra/replacements.py). A replaced or
# deleted share or cluster (DATA LOSS) or an update the Kubernetes API refuses (WILL FAIL) exits 1:
# make diff STACK=dev ARGS='zone=us-central1-b'
diff: $(INFRA_STAMP)
	$(INFRA_VENV)/bin/python -m infra.diff $(STACK) $(ARGS)

# The real preview (Pulumi CLI, credentials, docs/cloud.md), with the guardrails: the pack's
# virtualenv is created here, as in the workflows, because the engine does not install a local pack.
# Without the CLI: one line saying what to install, before any virtualenv is made.
preview: pulumi-cli $(INFRA_STAMP) $(POLICY_STAMP)
	pulumi preview --stack $(STACK) --policy-pack policy $(ARGS)

pulumi-cli:
	$(if $(shell command -v pulumi),,$(error make preview needs the Pulumi CLI, not on PATH: install it (curl -fsSL \
	https://get.pulumi.com | sh; https://www.pulumi.com/docs/iac/download-install/), pulumi login, and run it again \
	(make render STACK=$(STACK) needs no CLI)))

clean-local:
	rm -rf local
