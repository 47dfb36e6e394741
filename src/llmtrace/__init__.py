"""llmtrace — server-side tracing for LLM inference.

One line in serving code::

    import llmtrace
    llmtrace.instrument()

patches the network handlers, tokenizers, model forward and ``generate()`` of
the libraries the service uses (as they are imported) and emits the request and
engine traces described in docs/span-model.md. With no endpoint configured the
spans go to ``llmtrace-traces.jsonl``, which ``llmtrace analyze`` reads.

Custom engines report through the lifecycle API: :func:`start_request`,
:class:`RequestTracker` and :class:`EngineTracer`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from llmtrace._version import __version__
from llmtrace.errors import ConfigError, LLMTraceError, SourceError

if TYPE_CHECKING:
    from llmtrace._instrument import Instrumentation, flush, instrument, overhead_cpu_s, shutdown, uninstrument
    from llmtrace.lifecycle.engine import EngineTracer, StepRecord
    from llmtrace.lifecycle.propagation import extract as extract_carrier
    from llmtrace.lifecycle.propagation import inject as inject_carrier
    from llmtrace.lifecycle.request import RequestHandle, current_request, start_request
    from llmtrace.lifecycle.tracker import RequestTracker

# The root is lazy (PEP 562): ``import llmtrace.semconv`` or ``llmtrace.analysis`` runs this
# file, and the analysis side must load without the OpenTelemetry SDK or wrapt (it runs on
# laptops and in CI jobs that have neither). Each public name is imported from its module
# the first time it is read, then cached in the module's globals.
_LAZY: dict[str, tuple[str, str]] = {
    "Instrumentation": ("llmtrace._instrument", "Instrumentation"),
    "flush": ("llmtrace._instrument", "flush"),
    "instrument": ("llmtrace._instrument", "instrument"),
    "overhead_cpu_s": ("llmtrace._instrument", "overhead_cpu_s"),
    "shutdown": ("llmtrace._instrument", "shutdown"),
    "uninstrument": ("llmtrace._instrument", "uninstrument"),
    "EngineTracer": ("llmtrace.lifecycle.engine", "EngineTracer"),
    "StepRecord": ("llmtrace.lifecycle.engine", "StepRecord"),
    "extract_carrier": ("llmtrace.lifecycle.propagation", "extract"),
    "inject_carrier": ("llmtrace.lifecycle.propagation", "inject"),
    "RequestHandle": ("llmtrace.lifecycle.request", "RequestHandle"),
    "current_request": ("llmtrace.lifecycle.request", "current_request"),
    "start_request": ("llmtrace.lifecycle.request", "start_request"),
    "RequestTracker": ("llmtrace.lifecycle.tracker", "RequestTracker"),
}

__all__ = [
    "ConfigError",
    "EngineTracer",
    "Instrumentation",
    "LLMTraceError",
    "RequestHandle",
    "RequestTracker",
    "SourceError",
    "StepRecord",
    "__version__",
    "current_request",
    "extract_carrier",
    "flush",
    "inject_carrier",
    "instrument",
    "instrument_model",
    "overhead_cpu_s",
    "shutdown",
    "start_request",
    "uninstrument",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'llmtrace' has no attribute {name!r}")
    module_name, attribute = target
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def instrument_model(model: Any, *, layers: bool = False, engine_id: str | None = None) -> Any:
    """Trace a torch ``nn.Module``'s forward as ``llm.forward`` (forward hooks; no global patch).

    ``layers=True`` adds an ``llm.layer`` span per transformer block (the longest
    ``ModuleList``, e.g. ``transformer.h.N``; otherwise each direct child). Returns
    *model*; :func:`llmtrace.integrations.torch.uninstrument_model` removes the hooks.
    """
    from llmtrace.integrations.torch import instrument_model as _instrument_model

    return _instrument_model(model, layers=layers, engine_id=engine_id)
