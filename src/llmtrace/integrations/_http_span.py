"""What every HTTP server integration (ASGI, aiohttp) shares about llmtrace's SERVER span: the
stable HTTP conventions' error rules, the finished span's name and response attributes, the
``Host`` header, excluded URLs, and whether a call already runs inside someone's SERVER span."""

from __future__ import annotations

import os
import re
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from llmtrace import _runtime, semconv
from llmtrace._http_metrics import OTHER_METHOD
from llmtrace._safety import warn_once
from llmtrace.integrations import _server_span
from llmtrace.lifecycle.clock import to_wall_ns
from llmtrace.lifecycle.pending import exception_event

_SERVER = SpanKind.SERVER
_UNSET = Status(StatusCode.UNSET)


def server_span_in(context: otel_context.Context) -> bool:
    """Whether *context*'s current span is a SERVER span (someone above this middleware made one)."""
    span = trace.get_current_span(context)
    return getattr(span, "kind", None) is _SERVER and span.get_span_context().is_valid


def error_type(status: int | None, error: BaseException | None) -> str | None:
    """``error.type`` by the HTTP conventions: the exception's type, else a 5xx status code."""
    if error is not None:
        return type(error).__qualname__
    if status is not None and status >= 500:
        return str(status)
    return None


def error_description(status: int | None, error: BaseException | None) -> str:
    if error is not None:
        return f"{type(error).__name__}: {error}"
    return f"HTTP {status}"


def finish_http_span(start: _server_span.ServerSpanStart, attributes: dict[str, Any], method: str,
                     route: str | None, status_code: int | None, error_kind: str | None,
                     error: BaseException | None, start_ns: int, end_ns: int, offset: int) -> None:
    """Build a call's finished SERVER span from its request *attributes* (on the span builder's
    thread): named ``{method} {route}`` (the method alone without a route), the response's status
    code, ``error.type`` *error_kind* with status ERROR, and *error* — the exception the call
    failed with, if any — as an ``exception`` event."""
    name = "HTTP" if method == OTHER_METHOD else method
    if route:
        attributes[semconv.HTTP_ROUTE] = route
        name = f"{name} {route}"
    if status_code is not None:
        attributes[semconv.HTTP_RESPONSE_STATUS_CODE] = status_code
    status = _UNSET
    if error_kind is not None:
        attributes[semconv.ERROR_TYPE] = error_kind
        status = Status(StatusCode.ERROR, error_description(status_code, error))
    events = [] if error is None else [exception_event(error, timestamp=to_wall_ns(end_ns, offset))]
    _server_span.finish(start, name, start_ns, end_ns, offset, attributes, status, events)


def split_host(host: str) -> tuple[str, int | None]:
    """``example.com:8080`` -> (``example.com``, 8080); ``[::1]:8000`` -> (``::1``, 8000)."""
    if host.startswith("["):
        address, _, rest = host[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        address, _, port_text = host.partition(":")
    return address, int(port_text) if port_text.isdigit() else None


def excluded_urls(integration: str) -> re.Pattern[str] | None:
    """llmtrace's ``excluded_urls`` and OpenTelemetry's variables for *integration*
    (``OTEL_PYTHON_<NAME>_EXCLUDED_URLS``, else ``OTEL_PYTHON_EXCLUDED_URLS``), as one pattern."""
    sources = [_runtime.settings().excluded_urls,
               os.environ.get(f"OTEL_PYTHON_{integration.upper()}_EXCLUDED_URLS")
               or os.environ.get("OTEL_PYTHON_EXCLUDED_URLS")]
    patterns = [p.strip() for source in sources if source for p in source.split(",") if p.strip()]
    if not patterns:
        return None
    try:
        return re.compile("|".join(f"(?:{p})" for p in patterns))
    except re.error as exc:
        warn_once(f"excluded-urls-{integration}", "llmtrace: excluded URLs %r are not valid regular expressions "
                  "(%s); no URL is excluded", patterns, exc)
        return None
