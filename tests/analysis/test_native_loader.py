"""Loading the optional compiled core (_native.py, analysis/_native.py): a build from another version
or ``LLMTRACE_ANALYSIS_NATIVE=0`` leaves the Python code in charge, with the same results.

The version-mismatch case uses a stand-in ``llmtrace_native`` module put in ``sys.modules``
(a test double at the import seam: a real stale build would need a second Rust build).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from llmtrace.analysis import _native
from tests.analysis.test_sources import doc, otlp_span, write_lines


def test_a_build_from_another_version_is_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stale = types.ModuleType("llmtrace_native")
    stale.ABI_VERSION = _native.ABI_VERSION + 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llmtrace_native", stale)
    monkeypatch.delenv("LLMTRACE_ANALYSIS_NATIVE", raising=False)
    with caplog.at_level(logging.WARNING, logger="llmtrace._native"):
        assert _native._load() is None
    assert "another llmtrace version" in caplog.text and "pip install ./native" in caplog.text


def test_a_module_without_a_version_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llmtrace_native", types.ModuleType("llmtrace_native"))
    monkeypatch.delenv("LLMTRACE_ANALYSIS_NATIVE", raising=False)
    assert _native._load() is None


def test_the_environment_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMTRACE_ANALYSIS_NATIVE", "0")
    assert _native._load() is None


def test_analysis_without_the_compiled_core_reads_the_same(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [doc(otlp_span(spanId=f"{i:016x}")) for i in range(1, 4)])
    code = (
        "from llmtrace.analysis._native import native\n"
        "from llmtrace.analysis._kernels import KERNELS\n"
        "from llmtrace.analysis.sources import load_spans\n"
        "assert native is None and not KERNELS.compiled\n"
        f"print(len(load_spans({path!r}).spans))\n"
    )
    env = {**os.environ, "LLMTRACE_ANALYSIS_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "3"


def test_the_loaded_module_matches_this_version() -> None:
    module = importlib.util.find_spec("llmtrace_native")
    if module is None:
        pytest.skip("llmtrace-native not built (needs cargo: pip install ./native)")
    if os.environ.get("LLMTRACE_ANALYSIS_NATIVE") == "0":
        pytest.skip("LLMTRACE_ANALYSIS_NATIVE=0 runs the Python kernels")
    assert _native.native is not None, "llmtrace-native is installed but was not loaded (stale build?)"
    assert _native.native.ABI_VERSION == _native.ABI_VERSION
