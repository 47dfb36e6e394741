"""The ``vllm.general_plugins`` entry point: discoverable, opt-in, role-aware, never raising."""

from __future__ import annotations

import importlib.metadata

import pytest

from llmtrace import _instrument
from llmtrace.integrations.vllm import _plugin, vllm_plugin

pytestmark = pytest.mark.vllm


def test_entry_point_is_discoverable() -> None:
    """``pip install -e .`` registers llmtrace under vLLM's plugin group, pointing at vllm_plugin."""
    points = {p.name: p for p in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert "llmtrace.integrations.vllm:vllm_plugin" == points["llmtrace"].value
    assert vllm_plugin is points["llmtrace"].load()


def test_plugin_does_nothing_without_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed is not enabled: without LLMTRACE_VLLM the plugin leaves the process alone."""
    monkeypatch.delenv("LLMTRACE_VLLM", raising=False)
    vllm_plugin()
    assert _instrument.current() is None


@pytest.mark.parametrize(("value", "enabled"), [("1", True), ("true", True), ("on", True), ("0", False),
                                                ("", False), ("no", False)])
def test_opt_in_values(value: str, enabled: bool) -> None:
    assert enabled == _plugin.enabled_by_env({"LLMTRACE_VLLM": value})


@pytest.mark.parametrize(("name", "role"), [("EngineCore", "engine"), ("EngineCore_DP1", "engine"),
                                            ("VllmWorker-0", "worker"), ("Worker_TP1", "worker"),
                                            ("MainProcess", "api-server")])
def test_process_role_from_vllms_process_names(name: str, role: str) -> None:
    assert role == _plugin.process_role(name)


def test_plugin_swallows_a_bad_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid LLMTRACE_* value is a warning, never an exception into vLLM's start-up."""
    monkeypatch.setenv("LLMTRACE_VLLM", "1")
    monkeypatch.setenv("LLMTRACE_SAMPLE_RATIO", "not-a-number")
    vllm_plugin()
    assert _instrument.current() is None
