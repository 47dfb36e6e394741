"""The layers of docs/architecture.md hold at import time, not only in the import graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules_after(statement: str) -> list[str]:
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("statement", [
    "import llmtrace.analysis",
    "import llmtrace.semconv",
    "from llmtrace.analysis import load, analyze, to_json",
    "import llmtrace",
])
def test_the_analysis_side_loads_no_opentelemetry_and_no_wrapt(statement: str) -> None:
    """Analysis runs on machines without the SDK: importing it (or the lazy package root)
    loads neither OpenTelemetry nor wrapt nor any serving-side module."""
    loaded = _modules_after(statement)
    assert [m for m in loaded if m.split(".")[0] in ("opentelemetry", "wrapt")] == []
    serving = ("llmtrace.lifecycle", "llmtrace.integrations", "llmtrace._otel", "llmtrace._instrument")
    assert [m for m in loaded if m.startswith(serving)] == []


def test_the_package_root_still_exposes_the_public_api_lazily() -> None:
    """Reading a public name imports its module on first use; ``__all__`` names resolve."""
    loaded = _modules_after("import llmtrace\nassert callable(llmtrace.instrument)\n"
                            "assert all(getattr(llmtrace, n) is not None for n in llmtrace.__all__)")
    assert "llmtrace._instrument" in loaded
    assert "opentelemetry.sdk.trace" in loaded


def test_an_unknown_attribute_of_the_root_is_an_attribute_error() -> None:
    import llmtrace

    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = llmtrace.nonexistent
