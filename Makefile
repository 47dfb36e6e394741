# The README's commands. Each installs what it needs first (`.ci/run setup`: a cached venv
# keyed on pyproject.toml, Jaeger v2 and the gateway collector built from the Go module
# proxy, chromium); with everything cached that takes a few seconds.
LLMTRACE_CACHE ?= $(HOME)/.cache/llmtrace
export LLMTRACE_CACHE
VENV ?= $(LLMTRACE_CACHE)/venv
PYTHON := $(VENV)/bin/python
# .ci/run sets this after its own setup so `make test` does not repeat it.
SETUP := $(if $(LLMTRACE_SETUP_DONE),,setup)

.PHONY: setup setup-venv test lint demo stack-build stack-up

setup:  ## venv (pyproject + vLLM), Jaeger v2 and gateway collector from the Go proxy, chromium, Perfetto trace processor
	.ci/run setup

setup-venv:  ## the Python venv only: all the demo needs
	.ci/run venv

test: $(SETUP)  ## the whole suite, including the real collector + Jaeger end-to-end tests
	$(PYTHON) -m pytest -q

lint: $(SETUP)  ## ruff on src and tests, mypy strict on src
	$(PYTHON) -m ruff check src tests
	$(PYTHON) -m mypy

demo: $(if $(LLMTRACE_SETUP_DONE),,setup-venv)  ## reference server under load, traced, then the analysis
	$(VENV)/bin/llmtrace demo

# scripts/stack.py needs only the standard library and Go (for the first build): no venv.
stack-build:  ## build and cache the Go binaries of the local stack
	python3 scripts/stack.py build

stack-up:  ## collector + Jaeger without Docker, on the docker-compose ports (Ctrl-C stops)
	python3 scripts/stack.py up
