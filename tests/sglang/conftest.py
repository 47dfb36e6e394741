"""Fixtures of the SGLang adapter tests: SGLang's own cached environment, the model directory,
and a report of what ran.

SGLang 0.5.23 pins torch 2.14.1 (the main venv has vLLM's 2.14.0), so its tests run SGLang in
its own environment, built once by ``scripts/sglang-env`` (~8 min, cached outside the clone,
keyed by its pins): the servers are started with that environment's python, and the tests
that need SGLang objects in-process run a probe script in it (tests/sglang/probes.py). If the
environment cannot be built, every test that needs it is skipped with the build's own error
(``pytest -ra`` lists it): never a silent skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.driven import DrivenParts
from tests.sglang import tiny_model as tiny_model_dir

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = REPO / "scripts" / "sglang-env"
#: A cold build downloads ~5 GB of wheels; a warm check takes a few seconds.
ENV_BUILD_TIMEOUT_S = 1800
#: What each test drove for real, printed at the end of the run (pytest -ra shows skips and why).
DRIVEN = DrivenParts("SGLang parts driven for real (CPU, no GPU)")
driven = DRIVEN.add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    DRIVEN.report(terminalreporter)


@pytest.fixture(scope="session")
def sglang_python() -> Iterator[str]:
    """The python of SGLang's environment (built by scripts/sglang-env if needed)."""
    try:
        done = subprocess.run([str(ENV_SCRIPT)], check=False, capture_output=True, text=True,
                              timeout=ENV_BUILD_TIMEOUT_S, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"SGLang's environment could not be built (scripts/sglang-env): {exc}")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        pytest.skip("SGLang's environment could not be built (scripts/sglang-env, exit "
                    f"{done.returncode}): " + " | ".join(tail))
    yield done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir.build(tmp_path_factory.mktemp("tiny-sglang"))


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment of an SGLang process: this repo's tests and llmtrace importable, the test model
    architecture registered, no GPU sampler, no inherited llmtrace/OTel settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_", "SGLANG_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "src")])
    env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = tiny_model_dir.MODEL_PACKAGE
    env["LLMTRACE_GPU"] = "off"
    env["LLMTRACE_METRICS"] = "false"
    env.update(extra)
    return env


def run_probes(python: str, *names: str, timeout_s: float = 600) -> dict[str, Any]:
    """Run probes *names* of tests/sglang/probes.py in SGLang's environment; their JSON results by name."""
    done = subprocess.run([python, "-m", "tests.sglang.probes", *names], check=False, capture_output=True, text=True,
                          timeout=timeout_s, cwd=REPO, env=subprocess_env())
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"probes failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
    results: dict[str, Any] = json.loads(lines[-1])
    return results
