"""A changed target or an unsupported version turns the adapter off: one warning, nothing patched."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import wrapt

from llmtrace.integrations._targets import Target
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm.patch import VllmInstrumentor
from tests.vllm.conftest import requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def _raw(target: Target) -> Any:
    """The attribute as stored on its class (a wrapt proxy once patched)."""
    parent, attribute, _original = wrapt.resolve_path(target.module, target.path)
    return vars(parent).get(attribute)


def _originals() -> dict[str, Any]:
    return {f"{t.module}:{t.path}": _raw(t) for t in C.TARGETS}


def test_changed_signature_turns_the_adapter_off(vllm_module: Any, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A target whose parameters were renamed: warning names it; not one method is wrapped."""
    from vllm.v1.core.sched.scheduler import Scheduler

    def update_from_output(self: Any, output: Any, runner_output: Any) -> Any:  # renamed parameters
        return None

    monkeypatch.setattr(Scheduler, "update_from_output", update_from_output)
    before = _originals()
    instrumentor = VllmInstrumentor()
    with caplog.at_level(logging.WARNING, logger="llmtrace"):
        instrumentor.instrument()
    assert not instrumentor.active
    assert before == _originals()
    assert any("Scheduler.update_from_output" in p and "scheduler_output" in p for p in instrumentor.problems)
    assert any("vLLM adapter is OFF" in r.getMessage() for r in caplog.records) or instrumentor.problems


def test_missing_target_turns_the_adapter_off(vllm_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target that no longer exists is named in the problems; vLLM keeps its own methods."""
    from vllm.v1.engine.output_processor import OutputProcessor

    monkeypatch.delattr(OutputProcessor, "propagate_error")
    before = _originals_without("OutputProcessor.propagate_error")
    instrumentor = VllmInstrumentor()
    instrumentor.instrument()
    assert not instrumentor.active
    assert before == _originals_without("OutputProcessor.propagate_error")
    assert any("OutputProcessor.propagate_error: not found" in p for p in instrumentor.problems)


def _originals_without(path: str) -> dict[str, Any]:
    return {f"{t.module}:{t.path}": _raw(t) for t in C.TARGETS if t.path != path}


def test_unsupported_version_turns_the_adapter_off(vllm_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM outside the declared range is not patched at all."""
    monkeypatch.setattr(VllmInstrumentor, "installed_version", classmethod(lambda cls: "0.99.0"))
    before = _originals()
    instrumentor = VllmInstrumentor()
    instrumentor.instrument()
    assert not instrumentor.active
    assert before == _originals()
    assert ["version 0.99.0 is outside the supported range " + C.SUPPORTED] == instrumentor.problems


def test_instrument_and_uninstrument_restore_the_identical_methods(vllm_module: Any) -> None:
    """instrument() wraps every non-check-only target; uninstrument() puts the same objects back."""
    before = _originals()
    instrumentor = VllmInstrumentor()
    instrumentor.instrument()
    try:
        assert instrumentor.active
        wrapped = {k for k, v in _originals().items() if getattr(v, "_self_llmtrace", False)}
        expected = {f"{t.module}:{t.path}" for t in C.TARGETS if t.path not in C.CHECK_ONLY}
        assert expected == wrapped
    finally:
        instrumentor.uninstrument()
    assert before == _originals()
