"""OpenTelemetry's current context and the span in it, read on the request path without the API's frames.

Every request reads the current context and the span in it at least once, sampled or not. Through
the API each read is a Python frame or several (``get_current`` two, ``get_current_span`` three
with an ABC check); with the default runtime context, checked once at import, they are a
``ContextVar`` call and a dict read. Any other runtime context goes through the API. (A span
context's fields are read as the tuple it is: ``_otel/span_context.py``.)
"""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace


def _context_functions() -> tuple[Any, Any, Any]:
    """OpenTelemetry's ``get_current``, ``attach`` and ``detach``. With the default runtime context
    (a ``ContextVar``; ``OTEL_PYTHON_CONTEXT`` unset) they are exactly the variable's own
    ``get``/``set``/``reset`` behind two Python frames each: those are returned. Any other runtime
    context goes through the API."""
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and isinstance(variable, contextvars.ContextVar):
        return variable.get, variable.set, variable.reset
    return otel_context.get_current, otel_context.attach, otel_context.detach


#: ``current_context()``, ``attach(context) -> token``, ``detach(token)`` (may raise ValueError
#: for a token of another context, where the API logs instead: the caller catches it).
current_context, attach, detach = _context_functions()

#: The key under which OpenTelemetry's API keeps the current span in a context, read off the API
#: itself: the span in a context is ``context.get(SPAN_KEY)`` (a ``Context`` is a dict).
SPAN_KEY = next(iter(trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context())))
#: The context of a call that carried no propagation header.
NO_PARENT = otel_context.Context()
