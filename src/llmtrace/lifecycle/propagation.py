"""W3C trace-context carriers for requests that cross a process boundary.

A carrier is a plain ``dict[str, str]`` (``traceparent``, ``tracestate``) that
travels on the request message; reuse a field the engine already has (vLLM's
``trace_headers``) instead of adding one. A malformed carrier yields an empty
context (a new root), logged once — never an exception into the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmtrace._safety import warn_once

_PROPAGATOR = TraceContextTextMapPropagator()


def inject(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The carrier for *ctx* (default: the current context)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier


def extract(carrier: Mapping[str, str] | str | None) -> otel_context.Context:
    """The context a carrier describes; an empty one (and one warning) if it is malformed.

    A bare string is taken as the ``traceparent`` header's value (engines that carry only that)."""
    if not carrier:
        return otel_context.Context()
    if isinstance(carrier, str):
        carrier = {"traceparent": carrier}
    try:
        ctx = _PROPAGATOR.extract(dict(carrier), context=otel_context.Context())
    except Exception:  # noqa: BLE001 - a foreign carrier is untrusted input (not even a mapping, maybe)
        ctx = otel_context.Context()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        warn_once("bad-carrier", "llmtrace: ignoring a malformed trace carrier %s", _short_repr(carrier))
    return ctx


def _short_repr(value: object, limit: int = 200) -> str:
    """A carrier for a log line: any size arrives from another process, one line goes out."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
