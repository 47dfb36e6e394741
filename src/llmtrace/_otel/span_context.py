"""``SpanContext`` made and read as the tuple it is, where hot paths make or read one per span.

Through the API, making a ``SpanContext`` is a Python ``__new__`` (argument checks, an ``is_valid``
computation) and reading each field a property frame (``trace_flags.sampled`` two). A request or a
span handed to export does several of each. The API's ``SpanContext`` has been the tuple
``(trace_id, span_id, is_remote, trace_flags, trace_state, is_valid)`` since its first release;
that layout is checked once against the installed API, and with any other the callers keep the
API's constructor and properties.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

_tuple_new = tuple.__new__


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
