"""Wiring of the vLLM adapter: the all-or-nothing target check and the instrumentor.

The wrappers themselves live in :mod:`._api` (API-server process) and :mod:`._engine`
(EngineCore process). Every wrapper calls vLLM first-class: it takes a timestamp, calls
through, and hands the objects to a ``@guarded`` helper that reads them (through
:mod:`.extractors`) into the lifecycle API. vLLM's own exceptions pass through untouched;
an llmtrace error is logged once and counted, never raised.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import wrapt

from llmtrace._safety import warn_once
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.vllm import _api, _engine
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm import extractors as X
from llmtrace.integrations.vllm._binding import Wrapper


# --------------------------------------------------------------------------- target check
@dataclass(frozen=True)
class Checked:
    """A target that passed the check: its parameters' positions (``self`` not counted)."""

    target: C.Target
    positions: dict[str, int]


def check_targets(targets: tuple[C.Target, ...] = C.TARGETS) -> tuple[list[Checked], list[str]]:
    """Import every target module and check each method and its named parameters.

    Returns the checked targets and one line per problem; any problem means the
    adapter stays off.
    """
    checked: list[Checked] = []
    problems: list[str] = []
    for target in targets:
        where = f"{target.module}.{target.path}"
        try:
            importlib.import_module(target.module)
            _parent, _attribute, original = wrapt.resolve_path(target.module, target.path)
            parameters = list(inspect.signature(original).parameters)
        except Exception as exc:  # noqa: BLE001 - a missing module/attribute is what we report
            problems.append(f"{where}: not found ({type(exc).__name__}: {exc})")
            continue
        if parameters and parameters[0] == "self":
            parameters = parameters[1:]
        missing = [name for name in target.params if name not in parameters]
        if missing:
            problems.append(f"{where}: parameter(s) {', '.join(missing)} not in ({', '.join(parameters)})")
            continue
        checked.append(Checked(target, {name: parameters.index(name) for name in target.params}))
    return checked, problems


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


class VllmInstrumentor(Instrumentor):
    """vLLM (v1 engine): request traces in the API server, engine windows in EngineCore."""

    name = "vllm"
    trigger = C.TRIGGER
    distribution = C.DISTRIBUTION
    supported = C.SUPPORTED

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def instrument(self) -> None:
        """Check the installed vLLM first: an unsupported version or any changed target -> off."""
        if self.active:
            return
        try:
            self.problems = self.preflight()
        except Exception as exc:  # noqa: BLE001 - a broken check must not break vLLM's import
            self.problems = [f"target check failed: {type(exc).__name__}: {exc}"]
        if self.problems:
            warn_once("vllm:off", "llmtrace: vLLM adapter is OFF for vllm %s (supported %s): %s",
                      self.installed_version(), C.SUPPORTED, "; ".join(self.problems))
            return
        super().instrument()

    def preflight(self) -> list[str]:
        version = self.installed_version()
        if not X.version_supported(version, C.SUPPORTED_MIN, C.SUPPORTED_MAX_EXCLUSIVE):
            return [f"version {version} is outside the supported range {C.SUPPORTED}"]
        return check_targets()[1]

    def _patch(self) -> None:
        checked, problems = check_targets()
        if problems:  # changed between preflight and now (a concurrent import): stay off
            raise RuntimeError("; ".join(problems))
        for item in checked:
            if item.target.path in C.CHECK_ONLY:
                continue
            wrapper = _wrapper_for(item)
            if wrapper is None or not self.patches.wrap(item.target.module, item.target.path, wrapper):
                raise RuntimeError(f"could not wrap {item.target.module}.{item.target.path}")

    def _unpatch(self) -> None:
        _engine.reset()
        _api.API.reset()
