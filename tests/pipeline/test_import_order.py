"""Import order, uninstrument and re-instrument, each in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("import_order_script.py")
ALL_TARGETS = 10


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240, env=env,
                          cwd=ROOT, check=False)


def _scenario(order: str) -> dict[str, Any]:
    proc = _run(str(SCRIPT), order)
    assert 0 == proc.returncode, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("order", ["before", "after", "between"])
def test_instrument_before_or_after_import_patches_everything(order: str) -> None:
    """instrument() before or after the libraries are imported: every target patched; uninstrument
    unpatches; instrument again patches again; the workload gives the request trace only when on."""
    result = _scenario(order)
    assert ALL_TARGETS == len(result["patched"]), result["patched"]
    assert [] == result["patched_after_uninstrument"]
    assert result["patched"] == result["patched_again"]
    assert ["work"] == result["spans_uninstrumented"]
    expected = {"work", "llm.request", "llm.tokenize", "llm.prefill", "llm.decode"}
    assert expected <= set(result["spans"])
    if order == "after":
        assert result["restored"] is True


def test_instrument_imports_no_heavy_library() -> None:
    """`import llmtrace; llmtrace.instrument()` imports neither torch, transformers nor vllm (-X importtime)."""
    proc = _run("-X", "importtime", "-c", "import llmtrace; llmtrace.instrument(exporter='none', gpu='off')")
    assert 0 == proc.returncode, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert set() == imported & {"torch", "transformers", "vllm", "tokenizers", "fastapi", "grpc", "aiohttp"}
