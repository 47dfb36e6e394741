"""Wiring of the vLLM adapter: the all-or-nothing target check and the instrumentor.

The wrappers themselves live in :mod:`._api` (API-server process) and :mod:`._engine`
(EngineCore process). Every wrapper calls vLLM first-class: it takes a timestamp, calls
through, and hands the objects to a ``@guarded`` helper that reads them (through
:mod:`.extractors`) into the lifecycle API. vLLM's own exceptions pass through untouched;
an llmtrace error is logged once and counted, never raised.
"""

from __future__ import annotations

from collections.abc import Callable

from llmtrace.integrations import _targets
from llmtrace.integrations._targets import Checked
from llmtrace.integrations.vllm import _api, _engine
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm._binding import Wrapper


def check_targets(targets: tuple[_targets.Target, ...] = C.TARGETS) -> tuple[list[Checked], list[str]]:
    """The shared all-or-nothing check (:func:`llmtrace.integrations._targets.check_targets`) of vLLM's targets."""
    return _targets.check_targets(targets)


# --------------------------------------------------------------------------- the instrumentor
def _wrapper_for(checked: Checked) -> Wrapper | None:
    path, positions = checked.target.path, checked.positions
    if path.startswith("BaseRenderer."):
        return _api.render_wrapper(path.endswith("_async"))
    factories: dict[str, Callable[[dict[str, int]], Wrapper]] = {
        "OutputProcessor.add_request": _api.add_request_wrapper,
        "OutputProcessor.process_outputs": _api.process_outputs_wrapper,
        "OutputProcessor.abort_requests": _api.abort_requests_wrapper,
        "OutputProcessor.propagate_error": _api.propagate_error_wrapper,
        "Scheduler.add_request": _engine.add_request_wrapper,
        "Scheduler.schedule": _engine.schedule_wrapper,
        "Scheduler.update_from_output": _engine.update_from_output_wrapper,
        "Scheduler.finish_requests": _engine.finish_requests_wrapper,
    }
    factory = factories.get(path)
    if factory is None and path.endswith(".execute_model"):
        factory = _engine.execute_model_wrapper
    return factory(positions) if factory is not None else None


class VllmInstrumentor(_targets.EngineInstrumentor):
    """vLLM (v1 engine): request traces in the API server, engine windows in EngineCore."""

    name = "vllm"
    label = "vLLM"
    trigger = C.TRIGGER
    distribution = C.DISTRIBUTION
    supported = C.SUPPORTED
    targets = C.TARGETS
    supported_min = C.SUPPORTED_MIN
    supported_max_exclusive = C.SUPPORTED_MAX_EXCLUSIVE

    def wrapper_for(self, checked: Checked) -> Wrapper | None:
        if checked.target.path in C.CHECK_ONLY:
            return None
        wrapper = _wrapper_for(checked)
        if wrapper is None:
            raise RuntimeError(f"no wrapper for {checked.target.module}.{checked.target.path}")
        return wrapper

    def _unpatch(self) -> None:
        _engine.reset()
        _api.API.reset()
