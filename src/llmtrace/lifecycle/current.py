"""OpenTelemetry's current context and span contexts, read on the request path without the API's frames.

Every request reads the current context, the span in it and that span's ids at least once, sampled
or not. Through the API each read is a Python frame or several (``get_current`` two,
``get_current_span`` three with an ABC check, every ``SpanContext`` field a property); with the
default runtime context and the API's ``SpanContext`` layout, both checked once at import, they are
a ``ContextVar`` call, a dict read and a tuple unpack. Anything else goes through the API.
"""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

_tuple_new = tuple.__new__


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


def _direct_span_context_works() -> bool:
    """Whether a ``SpanContext`` is the tuple its ``__new__`` builds — ``(trace_id, span_id,
    is_remote, trace_flags, trace_state, is_valid)`` — so that it can be made and read as that
    tuple, skipping the constructor's frame and the properties'. Checked against the installed
    API once; any other layout keeps the API."""
    flags, state = TraceFlags(1), trace.DEFAULT_TRACE_STATE
    try:
        direct = _tuple_new(SpanContext, (3, 5, False, flags, state, True))
        made = SpanContext(3, 5, False, flags, state)
        trace_id, span_id, remote, made_flags, made_state, valid = made
        return (direct == made and direct.trace_id == 3 and direct.span_id == 5 and direct.is_remote is False
                and direct.trace_flags is flags and direct.trace_state is state and direct.is_valid
                and (trace_id, span_id, remote, made_flags, made_state, valid) == (3, 5, False, flags, state, True))
    except Exception:  # noqa: BLE001 - an API whose SpanContext is no longer that tuple
        return False


#: ``SpanContext`` made and read as a plain tuple (see :func:`_direct_span_context_works`).
DIRECT_SPAN_CONTEXT = _direct_span_context_works()
