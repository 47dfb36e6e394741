# The README's commands. Each installs what it needs first (`.ci/run setup`: a cached venv
# keyed on pyproject.toml, Jaeger v2 and the gateway collector built from the Go module
# proxy, chromium, Perfetto's trace processor); with everything cached that takes a few seconds.
LLMTRACE_CACHE ?= $(HOME)/.cache/llmtrace
export LLMTRACE_CACHE
VENV ?= $(LLMTRACE_CACHE)/venv
PYTHON := $(VENV)/bin/python
# .ci/run sets this after its own setup so `make test` does not repeat it.
SETUP := $(if $(LLMTRACE_SETUP_DONE),,setup)

.PHONY: setup setup-venv setup-demo test test-fast lint demo stack-build stack-up

setup:  ## venv (pyproject + vLLM + dev tools), native core, Jaeger v2 and gateway collector, chromium, Perfetto trace processor
	.ci/run setup

setup-venv:  ## the full Python venv (pyproject + vLLM + dev tools) and the native core: no stack, no browser
	.ci/run venv

setup-demo:  ## only what the demo imports (torch, transformers, FastAPI, uvicorn, httpx): no vLLM, no dev tools
	.ci/run venv-demo

test: $(SETUP)  ## the whole suite, including the real collector + Jaeger end-to-end tests
	$(PYTHON) -m pytest -q

demo: $(if $(LLMTRACE_SETUP_DONE),,setup-demo)  ## reference server under load, traced, then the analysis
	$(VENV)/bin/llmtrace demo

# The inner loop: the venv only (no Go stack, no chromium, no trace processor).
VENV_ONLY := $(if $(LLMTRACE_SETUP_DONE),,setup-venv)
FAST_TESTS := not stack and not vllm and not browser and not trace_processor and not slow

test-fast: $(VENV_ONLY)  ## the suite without the Jaeger stack, vLLM, a browser, the trace processor or the slow scenarios (markers: pyproject.toml)
	$(PYTHON) -m pytest -q -m "$(FAST_TESTS)"

lint: $(VENV_ONLY)  ## ruff, mypy strict on src and tests, the import-layer contracts, codespell; native: fmt, clippy, cargo test, stubtest
	$(PYTHON) -m ruff check src tests
	$(PYTHON) -m mypy
	PYTHONPATH=src $(VENV)/bin/lint-imports
	$(VENV)/bin/codespell
	.ci/run native-checks

# scripts/stack.py needs only the standard library and Go (for the first build): no venv.
stack-build:  ## build and cache the Go binaries of the local stack
	python3 scripts/stack.py build

stack-up:  ## collector + Jaeger without Docker, on the docker-compose ports (Ctrl-C stops)
	python3 scripts/stack.py up
