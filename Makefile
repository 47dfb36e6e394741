# The README's commands. `.ci/run` is the one-shot version of `setup` + `lint` + `test`.
LLMTRACE_CACHE ?= $(HOME)/.cache/llmtrace
export LLMTRACE_CACHE
VENV ?= $(LLMTRACE_CACHE)/venv
# Use the cached venv when it exists, else whatever python3/llmtrace are on PATH.
BIN := $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/,)
PYTHON := $(if $(BIN),$(BIN)python,python3)

.PHONY: setup test lint demo stack-up stack-build

setup:  ## venv (pyproject + vLLM), Jaeger v2 and gateway collector built from the Go proxy, chromium
	.ci/run setup

test:  ## the whole suite, including the real collector + Jaeger end-to-end tests
	$(PYTHON) -m pytest -q

lint:  ## ruff on src and tests, mypy strict on src
	$(PYTHON) -m ruff check src tests
	$(PYTHON) -m mypy

demo:  ## reference server under load, traced, then the analysis
	$(BIN)llmtrace demo

stack-build:  ## build and cache the Go binaries of the local stack
	$(PYTHON) scripts/stack.py build

stack-up:  ## collector + Jaeger without Docker, on the docker-compose ports (Ctrl-C stops)
	$(PYTHON) scripts/stack.py up
