"""Fixtures of the vLLM adapter tests: a local tiny model directory, and a report of what ran.

Nothing here downloads: the model directory is a 2-layer Llama ``config.json`` and a
BPE tokenizer trained on the spot with ``tokenizers``; vLLM runs it with
``load_format="dummy"`` and the fake executor (tests/vllm/fake_executor.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.driven import DrivenParts
from tests.vllm import tiny_model as tiny_model_dir

REPO = Path(__file__).resolve().parents[2]
#: Tests that run vLLM (in this process or a child) skip, saying why, where it is not installed.
requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                   reason="vLLM is not installed: the vLLM adapter tests did not run")
#: What each test drove for real, printed at the end of the run (pytest -ra shows skips and why).
DRIVEN = DrivenParts("vLLM parts driven for real (no GPU)")
driven = DRIVEN.add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    DRIVEN.report(terminalreporter)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir.build(tmp_path_factory.mktemp("tiny-llama"))


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment of a child Python that imports this repo's tests and runs vLLM on the CPU platform."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "src"), env.get("PYTHONPATH", "")])
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env["LLMTRACE_GPU"] = "off"
    env["LLMTRACE_METRICS"] = "false"
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def vllm_module() -> Iterator[Any]:
    """vLLM imported in this process on its CPU platform (skips, saying why, when it is not installed)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed: the vLLM adapter tests did not run")
    yield vllm


PYTHON = sys.executable
