"""llmtrace's middlewares for aiohttp: its own SERVER span, or its server scope inside someone else's.

:func:`server_span_middleware` is the aiohttp counterpart of ``_asgi_server.ServerSpanMiddleware``
(the same cost model, attributes and metrics): per call it extracts the caller's context (the
global propagator), opens the SERVER span's identity (``_server_span.begin``), counts the call as
active, runs the handler inside the span's context and llmtrace's server scope, and when the
handler is done records ``http.server.request.duration`` and — only for a sampled call — hands
the finished span to the span builder. It is an aiohttp middleware, so it starts after aiohttp
parsed the request and matched its route, and it ends when the handler returns (after the last
write of a streamed response; before aiohttp writes a response the handler returned unsent),
as OpenTelemetry's aiohttp-server middleware does.

A traced response carries ``traceresponse`` (and, when the handler returned it unsent,
``Server-Timing`` where the request's phases are known). Headers must be set before a response
is prepared: a response the handler returned is still unsent here; one the handler sends itself
(a ``StreamResponse``) gets them in :func:`traced_prepare`, which replaces
``StreamResponse.prepare`` and looks at one context variable, :data:`_traced`, set only for a
call whose SERVER span records: an unsampled call costs it one ``ContextVar.get``.

Nothing of llmtrace runs per streamed chunk. The first byte (``llm.time_to_first_byte_s``, an
attribute of a recording SERVER span) is the response's first write: once a traced call's
response is prepared, its payload writer (``StreamResponse._payload_writer``) is replaced by a
:class:`_FirstWrite` stand-in that notes the time at the first ``write``, puts the writer back and
passes the write on; later chunks go to aiohttp's writer untouched. Nothing is set on the response
that it did not have: an instance attribute ``write`` in front of the class's method adds the
name to the instances' shared attribute keys, after which CPython no longer specialises
``response.write(...)`` for any response of the class (~10k instructions more per 33-chunk
request, traced or not), and reading the instance's ``__dict__`` to remove it slowed every
attribute read of that response (~28k; callgrind, ``benchmarks/bench_aiohttp_request.py``). A
client that leaves is seen where aiohttp sees it: the connection's ``connection_lost`` cancels
the request it is serving (``BaseRequest._cancel``, hooked by :func:`traced_cancel`), which finds
the call in :data:`_in_flight` and ends its open requests as ``abort`` — before the handler's
next write fails, as ASGI's ``http.disconnect`` does. (A per-chunk ``write`` hook cost ~10k
instructions per 33-chunk request.) The hooks are plain functions put in the class, not wrapt
proxies, which are bound anew at every attribute access.

:func:`scope_middleware` is the server scope alone, for calls inside a SERVER span that
OpenTelemetry's middleware made (the host's, or ``server_spans="otel"``).
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import Status, StatusCode

from llmtrace import _runtime, semconv
from llmtrace._http_metrics import KNOWN_METHODS, OTHER_METHOD, HttpServerMetrics, normalize_method
from llmtrace._safety import guarded, record_error
from llmtrace.integrations import _server, _server_span
from llmtrace.integrations._http_span import finish_http_span, server_span_in
from llmtrace.integrations._server import ENABLED, Exchange
from llmtrace.integrations.aiohttp import extractors
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.clock import monotonic_ns, recent_offset_ns
from llmtrace.lifecycle.current import NO_PARENT, current_context
from llmtrace.lifecycle.current import attach as context_attach
from llmtrace.lifecycle.current import detach as context_detach
from llmtrace.lifecycle.phases import server_timing
from llmtrace.lifecycle.scope import enter_scope, exit_scope

INTEGRATION = "aiohttp"
_UNSET = Status(StatusCode.UNSET)
#: A client timing out the handler (aiohttp answers 504), else any exception (500).
_TIMEOUT_STATUS, _ERROR_STATUS = 504, 500

#: The excluded-URL pattern of the running ``instrument()`` (set by the integration's ``_patch``).
_excluded: re.Pattern[str] | None = None
#: ``_server.current_exchange`` without its Python frame: the context variable's own ``get``
#: (and ``set``/``reset``, once per call).
_find_exchange = _server._current_exchange.get
_set_exchange, _reset_exchange = _server._current_exchange.set, _server._current_exchange.reset
#: The calls being served, by ``id()`` of their request (alive while it is in here): how the
#: connection-lost hook, which runs outside the call's context, finds the call.
_in_flight: dict[int, Exchange] = {}
#: The call being served, where its SERVER span records (set only then): its response gets the
#: trace headers and its first write is timed when it is prepared.
_traced: contextvars.ContextVar[_Call | _Joined | None] = contextvars.ContextVar("llmtrace_aiohttp_traced",
                                                                                 default=None)


def configure(excluded: re.Pattern[str] | None) -> None:
    global _excluded
    _excluded = excluded


async def server_span_middleware(request: Any, handler: Any) -> Any:
    """llmtrace's SERVER span, its HTTP metrics and server scope, per call."""
    if INTEGRATION not in ENABLED or _find_exchange() is not None:
        return await handler(request)  # off, or a sub-application's: the outer call covers it
    excluded = _excluded
    if excluded is not None and extractors.is_excluded(excluded, request):
        return await handler(request)
    current = current_context()
    if current and server_span_in(current):  # (an empty context, the usual case, holds no span)
        return await scope_middleware(request, handler)
    try:
        call = _Call(request)
    except Exception as exc:  # noqa: BLE001 - llmtrace failed to open it: count it, serve untraced
        record_error("aiohttp.server_span", exc)
        return await handler(request)
    # The call's context, server scope and exchange (findable: the response's prepare hook looks
    # it up) are made current with the context variables' own set/reset: no Python frame per call.
    exchange = call.exchange
    token = context_attach(call.context)
    scope_token = enter_scope(exchange.scope)
    exchange_token = _set_exchange(exchange)
    _in_flight[id(request)] = exchange
    traced = _traced.set(call) if call.recording else None
    try:
        response = await handler(request)
    except BaseException as exc:
        call.failed(exc)
        raise
    else:
        call.status = getattr(response, "status", None)
        if call.stamps and not call.stamped:
            call.stamp(response, timing=True)
        return response
    finally:
        if traced is not None:
            _traced.reset(traced)
        del _in_flight[id(request)]
        try:  # (three resets: contextlib.suppress would add two calls to every HTTP call)
            _reset_exchange(exchange_token)
            exit_scope(scope_token)
            context_detach(token)
        except ValueError:  # finalised in another context (a cancelled task): nothing to restore there
            pass
        try:
            call.close()
        except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host
            record_error("aiohttp.server_span_close", exc)


server_span_middleware.__middleware_version__ = 1  # type: ignore[attr-defined]  # aiohttp's new-style marker


async def scope_middleware(request: Any, handler: Any) -> Any:
    """One :class:`~llmtrace.integrations._server.Exchange` per call, in the current SERVER span."""
    if INTEGRATION not in ENABLED or _find_exchange() is not None:
        return await handler(request)
    exchange = _server.Exchange()
    _in_flight[id(request)] = exchange
    traced = _traced.set(_Joined(exchange)) if exchange.span.is_recording() else None
    try:
        return await _server.run_in_exchange(exchange, lambda: handler(request), _is_disconnect)
    finally:
        if traced is not None:
            _traced.reset(traced)
        del _in_flight[id(request)]


scope_middleware.__middleware_version__ = 1  # type: ignore[attr-defined]  # aiohttp's new-style marker


def traced_prepare(prepare: Any) -> Any:
    """``StreamResponse.prepare`` (*prepare*): a traced call's response gets its headers before
    they are sent, and its first write will note the first byte. (Called twice for a response
    the handler prepared itself: aiohttp prepares every response the handler returns.)"""

    def prepare_traced(self: Any, request: Any) -> Any:
        # A plain function that returns aiohttp's own coroutine for an untraced call: no coroutine
        # of llmtrace's per call (two calls per response). Callers await it at once, as aiohttp's do.
        traced = _traced.get()
        if traced is None or traced.timed:
            return prepare(self, request)
        try:
            traced.prepared(self)
        except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host (no guard frame per call)
            record_error("aiohttp.prepare", exc)
            return prepare(self, request)
        return _prepare_timed(self, request, prepare, traced)

    prepare_traced.__wrapped__ = prepare  # type: ignore[attr-defined]
    return prepare_traced


async def _prepare_timed(response: Any, request: Any, prepare: Any, traced: _Call | _Joined) -> Any:
    """*prepare* the response of a *traced* call, then put :class:`_FirstWrite` in front of its writer."""
    writer = await prepare(response, request)
    if writer is not None and getattr(response, "_payload_writer", None) is writer:
        response._payload_writer = _FirstWrite(response, writer, traced)
    return writer


class _FirstWrite:
    """A prepared response's payload writer until its first write (see the module docstring):
    anything else is the writer's own."""

    __slots__ = ("_response", "_traced", "_writer")

    def __init__(self, response: Any, writer: Any, traced: _Call | _Joined) -> None:
        object.__setattr__(self, "_response", response)
        object.__setattr__(self, "_writer", writer)
        object.__setattr__(self, "_traced", traced)

    def _done(self, timed: bool) -> Any:
        writer = self._writer
        if getattr(self._response, "_payload_writer", None) is self:
            self._response._payload_writer = writer
        if timed:
            self._traced.first_byte()
        return writer

    def write(self, chunk: Any, *args: Any, **kwargs: Any) -> Any:
        if not chunk:  # no byte yet: stay in front
            return self._writer.write(chunk, *args, **kwargs)
        return self._done(True).write(chunk, *args, **kwargs)

    def write_eof(self, chunk: Any = b"", *args: Any, **kwargs: Any) -> Any:
        return self._done(bool(chunk)).write_eof(chunk, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._writer, name, value)


class _Joined:
    """A call inside a recording SERVER span that someone else made: only its first write is timed."""

    __slots__ = ("exchange", "timed")

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.timed = False

    def prepared(self, response: Any) -> None:
        self.timed = True

    def first_byte(self) -> None:
        self.exchange.first_byte(True)  # guarded: never raises into aiohttp (the span is live)


def traced_cancel(cancel: Any) -> Any:
    """``BaseRequest._cancel`` (*cancel*), which aiohttp calls on the request a connection is
    serving when the connection is lost (or the server shuts down): its call's open requests end
    as ``abort``."""

    def cancel_traced(self: Any, exc: BaseException) -> None:
        exchange = _in_flight.get(id(self))
        if exchange is not None:
            exchange.disconnected(exc)  # guarded: never raises into aiohttp
        cancel(self, exc)

    cancel_traced.__wrapped__ = cancel  # type: ignore[attr-defined]
    return cancel_traced


@guarded("aiohttp.disconnect", default=False)
def _is_disconnect(error: BaseException) -> bool:
    return extractors.is_disconnect(error)


def extract_context(headers: Any) -> otel_context.Context:
    """The caller's context from aiohttp's request headers (a case-insensitive multidict), through
    the global propagator; a request that carries none of the propagator's headers gets the empty
    context without calling it (as ``_asgi_server.extract_context``)."""
    propagator = propagate.get_global_textmap()
    cached = _server_span.fields_cache
    if cached is not None and cached[0] is propagator:
        fields = cached[1]
    else:
        fields = _server_span.propagation_fields(propagator)
    carrier: dict[str, str] | None = None
    if fields is None:
        for name, value in headers.items():
            if carrier is None:
                carrier = {}
            key = name.lower()
            carrier[key] = f"{carrier[key]},{value}" if key in carrier else value
    else:
        for name in fields.text:
            if name in headers:
                if carrier is None:
                    carrier = {}
                carrier[name] = ",".join(headers.getall(name))
    if carrier is None:
        return NO_PARENT
    return propagator.extract(carrier, context=otel_context.Context())


class _Call:
    """One HTTP call under llmtrace's SERVER span."""

    __slots__ = ("_ended", "_live", "_metrics", "context", "error", "exchange", "method", "offset", "recording",
                 "request", "scheme", "stamped", "stamps", "start", "start_ns", "status", "timed")

    def __init__(self, request: Any) -> None:
        self.start_ns = start = monotonic_ns()
        self.offset = offset = recent_offset_ns(start)
        self.request = request
        method = request.method
        self.method = method = method if method in KNOWN_METHODS else normalize_method(str(method))
        self.scheme = scheme = request.scheme
        self.start = opened = _server_span.begin(extract_context(request.headers),
                                                 "HTTP" if method == OTHER_METHOD else method, start, offset)
        span, self.recording, _, self.context, _ = opened
        self._live = not isinstance(span, _server_span.ServerSpan)  # a live API span: ended in any case
        self.exchange = Exchange(span, start, offset, self.context)
        self.stamps = self.recording and _runtime.settings().response_headers
        self.stamped = self.timed = False
        self.status: int | None = None
        self.error: BaseException | None = None
        self._metrics: HttpServerMetrics | None = _runtime.http_metrics()
        metrics = self._metrics
        self._ended = metrics.started(method, scheme) if metrics is not None else None

    def prepared(self, response: Any) -> None:
        """*response* is being prepared (sent) while this recording call runs: its trace headers."""
        self.timed = True
        if self.stamps and not self.stamped:
            self.stamp(response, timing=False)

    def first_byte(self) -> None:
        """The response's first body bytes are being written now (the span's attribute is added
        when it is built)."""
        self.exchange.scope.first_byte_ns = monotonic_ns()

    @guarded("aiohttp.response_headers")
    def stamp(self, response: Any, timing: bool) -> None:
        """Put the trace headers on *response* (unsent); *timing*: the handler is done with it, so
        the phases of a non-streamed one are known."""
        self.stamped = True
        if response.prepared:
            return
        headers = response.headers
        headers[semconv.HEADER_TRACERESPONSE] = _server_span.traceresponse(self.start.span)
        headers.add(semconv.HEADER_EXPOSE_HEADERS, semconv.HEADER_TRACERESPONSE)
        handles = self.exchange.scope.handles
        if timing and handles and response.content_type != "text/event-stream":
            entries = server_timing(handles[0])
            if entries:
                headers[semconv.HEADER_SERVER_TIMING] = ", ".join(f"{name};dur={seconds * 1000:.3f}"
                                                                  for name, seconds in entries)

    @guarded("aiohttp.failed")
    def failed(self, error: BaseException) -> None:
        """The handler raised *error*: a response (``HTTPException``), the client leaving, or a failure."""
        if extractors.is_http_exception(error):
            self.status = getattr(error, "status", None)
            if self.stamps and not self.stamped:
                self.stamp(error, timing=True)
            self.error = error
            self.exchange.finish(error)
        elif _is_disconnect(error):
            self.exchange.disconnected(error)
        else:
            self.error = error
            self.status = _TIMEOUT_STATUS if isinstance(error, asyncio.TimeoutError) else _ERROR_STATUS
            self.exchange.finish(error)

    def close(self) -> None:
        """The call is over: its metrics, and its span handed to the span builder if sampled.
        (The middleware guards it: telemetry errors are counted, never raised.)"""
        end = monotonic_ns()
        if not self.exchange.complete:
            self.exchange.finish()
        request = self.request
        route = extractors.route_of(request)
        status, error = self.status, self.error
        error_type = extractors.error_type(status, error) if error is not None or (status or 0) >= 500 else None
        if self._metrics is not None and self._ended is not None:
            self._metrics.request_done(self._ended, (end - self.start_ns) * 1e-9, self.method, self.scheme, status,
                                       route, extractors.protocol_version(request.version), error_type)
        if self.recording or self._live:
            BUILDER.submit(lambda: self._build(end, route, error_type))

    def _build(self, end_ns: int, route: str | None, error_type: str | None) -> None:
        # A raised HTTPException is the response the handler chose: no exception event for it.
        error = None if extractors.is_http_exception(self.error) else self.error
        attributes = extractors.server_attributes(self.request, self.method)
        scope = self.exchange.scope
        if scope.first_byte_ns is not None:
            attributes[semconv.LLM_TIME_TO_FIRST_BYTE_S] = (scope.first_byte_ns - scope.arrival_ns) * 1e-9
        finish_http_span(self.start, attributes, self.method, route, self.status, error_type, error, self.start_ns,
                         end_ns, self.offset)
