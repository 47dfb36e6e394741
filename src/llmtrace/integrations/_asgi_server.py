"""llmtrace's own HTTP SERVER span for ASGI apps (FastAPI, Starlette, vLLM's API server).

One :class:`ServerSpanMiddleware` wraps an app's built middleware stack. Per HTTP call it
extracts the caller's context (the global propagator, ``OTEL_PROPAGATORS``), opens the
SERVER span's identity (``_server_span.begin``), counts the call as active, runs the app
inside the span's context and llmtrace's server scope, and when the response is complete
records ``http.server.request.duration`` and — only for a sampled call — hands the finished
span to the span builder. Nothing per call allocates per body chunk: the ``send`` the app gets
looks at a message's type and returns the server's own awaitable, compiled where
llmtrace-native is built (``_asgi.app_send``).

Attributes follow the stable HTTP semantic conventions, as OpenTelemetry's ASGI middleware
emits them with ``OTEL_SEMCONV_STABILITY_OPT_IN=http``, with one deliberate difference:
``server.address`` is the host alone (``example.com``), as the conventions define it, where
that middleware keeps the port in it (``example.com:8080``); the port is ``server.port``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from llmtrace import _runtime, semconv
from llmtrace._http_metrics import KNOWN_METHODS, OTHER_METHOD, HttpServerMetrics, normalize_method
from llmtrace._safety import guarded, record_error
from llmtrace.integrations import _asgi, _server_span
from llmtrace.integrations._asgi import (
    Message,
    ObservedCall,
    Receive,
    ScopeMiddleware,
    Send,
    has_otel_middleware,
    header,
    is_disconnect,
)
from llmtrace.integrations._http_span import error_type as http_error_type
from llmtrace.integrations._http_span import excluded_urls, finish_http_span, server_span_in, split_host
from llmtrace.integrations._server import ENABLED, Exchange
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.clock import monotonic_ns, recent_offset_ns
from llmtrace.lifecycle.current import NO_PARENT, current_context
from llmtrace.lifecycle.current import attach as context_attach
from llmtrace.lifecycle.current import detach as context_detach
from llmtrace.lifecycle.phases import server_timing
from llmtrace.lifecycle.scope import enter_scope, exit_scope

_SERVER = SpanKind.SERVER
_UNSET = Status(StatusCode.UNSET)
# The response headers' names as ASGI sends them, encoded once (added to every traced response).
_TRACERESPONSE = semconv.HEADER_TRACERESPONSE.encode()
_EXPOSE_TRACERESPONSE = (semconv.HEADER_EXPOSE_HEADERS.encode(), _TRACERESPONSE)
_SERVER_TIMING = semconv.HEADER_SERVER_TIMING.encode()


class ServerSpanMiddleware:
    """ASGI middleware: llmtrace's SERVER span, its HTTP metrics and server scope per HTTP call."""

    def __init__(self, app: Any, integration: str, excluded: re.Pattern[str] | None = None,
                 route_of: Callable[[Message], str | None] | None = None) -> None:
        self.app = app
        self._integration = integration  # the integration that added it: off when that one is
        self._excluded = excluded
        self._route_of = route_of or scope_route
        self._joined = ScopeMiddleware(app, integration)  # a call inside someone else's SERVER span
        self._llmtrace_scope_middleware = True

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or self._integration not in ENABLED:
            await self.app(scope, receive, send)
            return
        if self._excluded is not None and self._excluded.search(request_url(scope)):
            await self.app(scope, receive, send)
            return
        current = current_context()
        if current and server_span_in(current):  # (an empty context, the usual case, holds no span)
            await self._joined(scope, receive, send)
            return
        try:
            call = _Call(scope, receive, send, self._route_of)
        except Exception as exc:  # noqa: BLE001 - llmtrace failed to open it: count it, serve untraced
            record_error("asgi.server_span", exc)
            await self.app(scope, receive, send)
            return
        sender = _asgi.app_send(send, call.send)
        # The call's context and server scope are made current with the context variables' own
        # set/reset (no Python frame per call; Exchange.enter/exit do the same for other servers).
        token = context_attach(call.context)
        scope_token = enter_scope(call.exchange.scope)
        try:
            await self.app(scope, call.receive, sender)
        except BaseException as exc:
            call.failed(exc)
            raise
        finally:
            try:  # noqa: SIM105 - contextlib.suppress would add two calls to every HTTP call
                exit_scope(scope_token)
            except ValueError:  # finalised in another context (a cancelled task): nothing to restore there
                pass
            try:  # noqa: SIM105 - as above
                context_detach(token)
            except ValueError:
                pass
            try:
                call.close()
            except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host
                record_error("asgi.server_span_close", exc)


class _Call(ObservedCall):
    """One HTTP call under llmtrace's SERVER span."""

    __slots__ = ("_ended", "_live", "_metrics", "_recording", "_route_of", "context", "end_ns", "error", "method",
                 "offset", "scheme", "scope", "start", "start_ns", "status")

    def __init__(self, scope: Message, receive: Receive, send: Send,
                 route_of: Callable[[Message], str | None]) -> None:
        self.start_ns = start = monotonic_ns()
        self.offset = offset = recent_offset_ns(start)
        self.scope = scope
        method = scope.get("method")
        self.method = method = method if method in KNOWN_METHODS else normalize_method(str(method or ""))
        self.scheme = str(scope.get("scheme") or "http")
        self._route_of = route_of
        self.start = opened = _server_span.begin(extract_context(scope.get("headers") or ()),
                                                 "HTTP" if method == OTHER_METHOD else method, start, offset)
        span, self._recording, _, self.context, _ = opened
        self._live = not isinstance(span, _server_span.ServerSpan)  # a live API span: ended in any case
        super().__init__(Exchange(span, start, offset, self.context, self._recording), receive, send)
        self.status: int | None = None
        self.error: BaseException | None = None
        self.end_ns: int | None = None
        self._metrics: HttpServerMetrics | None = _runtime.http_metrics()
        metrics = self._metrics
        self._ended = metrics.started(method, self.scheme) if metrics is not None else None

    # ----------------------------------------------------------------- the request path
    def _started(self, message: Message) -> Message:
        status = message.get("status")
        self.status = status if isinstance(status, int) else None
        self.response_start = message
        if self._recording:
            return self._traced_start(message) or message
        return message

    def _first_bytes(self, message: Message) -> None:
        self.exchange.scope.first_byte_ns = monotonic_ns()
        if self._recording:
            self._first_byte(message)

    def _sent_last(self) -> None:
        self.end_ns = monotonic_ns()
        self.exchange.finish()

    @guarded("asgi.first_byte")
    def _first_byte(self, message: Message) -> None:
        scope = self.exchange.scope
        if _asgi.is_streamed(self.response_start, message) and scope.first_byte_ns is not None:
            self.start[0].set_attribute(semconv.LLM_TIME_TO_FIRST_BYTE_S,  # (.span without its frame and cast)
                                        (scope.first_byte_ns - scope.arrival_ns) * 1e-9)

    @guarded("asgi.response_start", default=None)
    def _traced_start(self, message: Message) -> Message | None:
        """A traced response's start message with the headers that link it to its trace."""
        if not _runtime.settings().response_headers:
            return None
        return {**message, "headers": [*(message.get("headers") or ()), *self._trace_headers(message)]}

    def _trace_headers(self, start: Message) -> list[tuple[bytes, bytes]]:
        headers = [(_TRACERESPONSE, _server_span.traceresponse(self.start[0]).encode()),  # (.span, as above)
                   _EXPOSE_TRACERESPONSE]
        handles = self.exchange.scope.handles
        if handles and not _declares_stream(start.get("headers") or ()):
            entries = server_timing(handles[0])
            if entries:
                value = ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in entries)
                headers.append((_SERVER_TIMING, value.encode()))
        return headers

    def failed(self, error: BaseException) -> None:
        if is_disconnect(error):
            self.exchange.disconnected(error)
        else:
            self.error = error
            self.exchange.finish(error)

    # ----------------------------------------------------------------- the end
    def close(self) -> None:
        """The call is over: its metrics, and its span handed to the span builder if sampled.
        (The middleware guards it: telemetry errors are counted, never raised.)"""
        end = self.end_ns if self.end_ns is not None else monotonic_ns()
        if not self.exchange.complete:
            self.exchange.finish()  # a response the app never completed
        route = self._route_of(self.scope)
        status, error = self.status, self.error
        error_type = http_error_type(status, error) if error is not None or (status or 0) >= 500 else None
        if self._metrics is not None and self._ended is not None:
            self._metrics.request_done(self._ended, (end - self.start_ns) * 1e-9, self.method, self.scheme, status,
                                       route, self.scope.get("http_version"), error_type)
        if self._recording or self._live:
            BUILDER.submit(lambda: self._build(end, route, error_type))

    def _build(self, end_ns: int, route: str | None, error_type: str | None) -> None:
        finish_http_span(self.start, server_attributes(self.scope, self.method), self.method, route, self.status,
                         error_type, self.error, self.start_ns, end_ns, self.offset)


def _declares_stream(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return _asgi.is_streamed({"headers": headers}, {})


# --------------------------------------------------------------------------- context
def extract_context(headers: Iterable[tuple[bytes, bytes]]) -> otel_context.Context:
    """The caller's context from the request headers, through the global propagator. A request
    that carries none of the propagator's headers (most, behind a load balancer that does not
    trace) gets the empty context without calling it."""
    propagator = propagate.get_global_textmap()
    cached = _server_span.fields_cache
    if cached is not None and cached[0] is propagator:
        fields = cached[1]
    else:
        fields = _server_span.propagation_fields(propagator)
    wanted = None if fields is None else fields.raw
    carrier: dict[str, str] | None = None
    for name, value in headers:
        if wanted is None or name in wanted:
            if carrier is None:
                carrier = {}
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            carrier[key] = f"{carrier[key]},{text}" if key in carrier else text
    if carrier is None:
        return NO_PARENT
    return propagator.extract(carrier, context=otel_context.Context())


# --------------------------------------------------------------------------- attributes
def scope_route(scope: Message) -> str | None:
    """The route template the framework matched (Starlette >= 0.48 and FastAPI leave the
    route in the scope), prefixed by the path of any ``Mount`` it went through."""
    route = scope.get("route")
    path = getattr(route, "path", None) if route is not None else None
    if not isinstance(path, str):
        return None
    mounted = scope.get("root_path") or ""
    app_root = scope.get("app_root_path") or ""
    if mounted != app_root and mounted.startswith(app_root):
        return mounted[len(app_root):] + path
    return path


def request_url(scope: Message) -> str:
    """``scheme://host[:port]/path`` as OpenTelemetry's instrumentations match excluded URLs."""
    host = header(scope.get("headers") or (), b"host")
    if host is not None:
        authority = host.decode("latin-1")
    else:
        server = scope.get("server") or ("0.0.0.0", 80)
        authority = f"{server[0]}:{server[1]}" if server[1] not in (80, None) else str(server[0])
    return f"{scope.get('scheme') or 'http'}://{authority}{scope.get('path') or ''}"


def server_attributes(scope: Message, method: str) -> dict[str, Any]:
    """The request attributes of the SERVER span (built off the request path)."""
    attrs: dict[str, Any] = {semconv.HTTP_REQUEST_METHOD: method, semconv.URL_SCHEME: scope.get("scheme") or "http"}
    original = str(scope.get("method") or "")
    if original != method:
        attrs[semconv.HTTP_REQUEST_METHOD_ORIGINAL] = original
    if path := scope.get("path"):
        attrs[semconv.URL_PATH] = path
    query = scope.get("query_string")
    if query:
        attrs[semconv.URL_QUERY] = query.decode("utf-8", "replace") if isinstance(query, bytes) else str(query)
    headers = scope.get("headers") or ()
    server = scope.get("server") or (None, None)
    host = header(headers, b"host")
    address, port = split_host(host.decode("latin-1")) if host else (server[0], None)
    if address:
        attrs[semconv.SERVER_ADDRESS] = address
    if (port := port if port is not None else server[1]) is not None:
        attrs[semconv.SERVER_PORT] = int(port)
    client = scope.get("client")
    if client:
        attrs[semconv.CLIENT_ADDRESS] = client[0]
        if client[1] is not None:
            attrs[semconv.CLIENT_PORT] = int(client[1])
    if version := scope.get("http_version"):
        attrs[semconv.NETWORK_PROTOCOL_VERSION] = version
    if (agent := header(headers, b"user-agent")) is not None:
        attrs[semconv.USER_AGENT_ORIGINAL] = agent.decode("latin-1")
    return attrs


# --------------------------------------------------------------------------- wiring
@guarded("asgi.traced_stack")
def traced_stack(stack: Any, integration: str, route_of: Callable[[Message], str | None] | None = None) -> Any:
    """An app's built middleware stack with what ``server_spans`` asks for around it (the ``otel``
    mode is the integration's own business): a stack that already holds OpenTelemetry's
    middleware keeps that SERVER span, and llmtrace's scope joins it (never two SERVER spans)."""
    if has_otel_middleware(stack):
        return stack  # its constructor hook put llmtrace's scope middleware inside it
    if _runtime.settings().server_spans == "off":
        return ScopeMiddleware(stack, integration)
    return ServerSpanMiddleware(stack, integration, excluded_urls(integration), route_of)
