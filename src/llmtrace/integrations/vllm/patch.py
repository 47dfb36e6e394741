"""Wiring of the vLLM adapter: the all-or-nothing target check and the instrumentor.

The hooks themselves live in :mod:`._api` (API-server process) and :mod:`._engine`
(EngineCore process). Every hook calls vLLM first-class: it takes a timestamp, calls
through, and hands the objects to a ``@guarded`` helper that reads them (through
:mod:`.extractors`) into the lifecycle API. vLLM's own exceptions pass through untouched;
an llmtrace error is logged once and counted, never raised.
"""

from __future__ import annotations

from llmtrace.integrations import _targets
from llmtrace.integrations._targets import Checked, HookMaker
from llmtrace.integrations.vllm import _api, _engine
from llmtrace.integrations.vllm import _constants as C


def check_targets(targets: tuple[_targets.Target, ...] = C.TARGETS) -> tuple[list[Checked], list[str]]:
    """The shared all-or-nothing check (:func:`llmtrace.integrations._targets.check_targets`) of vLLM's targets."""
    return _targets.check_targets(targets)


# --------------------------------------------------------------------------- the instrumentor
_HOOKS: dict[str, HookMaker] = {
    "OutputProcessor.add_request": _api.add_request_hook,
    "OutputProcessor.process_outputs": _api.process_outputs_hook,
    "OutputProcessor.abort_requests": _api.abort_requests_hook,
    "OutputProcessor.propagate_error": _api.propagate_error_hook,
    "Scheduler.add_request": _engine.add_request_hook,
    "Scheduler.schedule": _engine.schedule_hook,
    "Scheduler.update_from_output": _engine.update_from_output_hook,
    "Scheduler.finish_requests": _engine.finish_requests_hook,
}


def _hook_for(path: str) -> HookMaker | None:
    if path.startswith("BaseRenderer."):
        return _api.render_hook
    if path.endswith(".execute_model"):
        return _engine.execute_model_hook
    return _HOOKS.get(path)


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

    def hook_for(self, checked: Checked) -> HookMaker | None:
        if checked.target.path in C.CHECK_ONLY:
            return None
        make = _hook_for(checked.target.path)
        if make is None:
            raise RuntimeError(f"no hook for {checked.target.module}.{checked.target.path}")
        return make

    def _unpatch(self) -> None:
        _engine.reset()
        _api.API.reset()
