"""The ``sglang.srt.plugins`` entry point: discoverable, opt-in, role-aware, never raising
(runs in the main venv: none of it imports SGLang)."""

from __future__ import annotations

import importlib.metadata

import pytest

from llmtrace import _instrument, _registry
from llmtrace.integrations.sglang import _plugin, sglang_plugin

pytestmark = pytest.mark.sglang


def test_entry_point_is_discoverable() -> None:
    """``pip install -e .`` registers llmtrace under SGLang's general-plugin group."""
    points = {p.name: p for p in importlib.metadata.entry_points(group="sglang.srt.plugins")}
    assert "llmtrace.integrations.sglang:sglang_plugin" == points["llmtrace"].value
    assert sglang_plugin is points["llmtrace"].load()


def test_the_registry_hooks_the_adapter_on_sglang_srt() -> None:
    specs = {spec.name: spec for spec in _registry.REGISTRY}
    assert ("sglang.srt", "llmtrace.integrations.sglang") == (specs["sglang"].trigger, specs["sglang"].module)


def test_plugin_does_nothing_without_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed is not enabled: without LLMTRACE_SGLANG the plugin leaves the process alone."""
    monkeypatch.delenv("LLMTRACE_SGLANG", raising=False)
    sglang_plugin()
    assert _instrument.current() is None


@pytest.mark.parametrize(("value", "enabled"), [("1", True), ("true", True), ("on", True), ("0", False),
                                                ("", False), ("no", False)])
def test_opt_in_values(value: str, enabled: bool) -> None:
    assert enabled == _plugin.enabled_by_env({"LLMTRACE_SGLANG": value})


@pytest.mark.parametrize(("stack", "role"), [
    (["sglang_plugin", "load_plugins", "run_scheduler_process", "_bootstrap"], "scheduler"),
    (["sglang_plugin", "load_plugins", "run_detokenizer_process"], "detokenizer"),
    (["load_plugins", "run_data_parallel_controller_process"], "dp-controller"),
    (["load_plugins", "_launch_subprocesses", "launch_server", "<module>"], "api-server"),
])
def test_process_role_from_sglangs_process_entry_functions(stack: list[str], role: str) -> None:
    assert role == _plugin.process_role(stack)


def test_plugin_swallows_a_bad_configuration(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """An invalid LLMTRACE_* value is one warning line, never an exception into SGLang's start-up."""
    monkeypatch.setenv("LLMTRACE_SGLANG", "1")
    monkeypatch.setenv("LLMTRACE_SAMPLE_RATIO", "not-a-number")
    sglang_plugin()
    assert _instrument.current() is None
    assert any("SGLang plugin could not start tracing" in r.getMessage() for r in caplog.records)
