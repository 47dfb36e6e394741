"""llmtrace's own gRPC SERVER span: one per RPC, made by llmtrace's interceptor.

The gRPC counterpart of ``integrations/_asgi_server.py``, on the same transport-neutral core
(``integrations/_server_span.py``). Per RPC, on the thread (or task) that runs the handler: the
caller's context from the invocation metadata (the global propagator, not called for metadata
without its keys), the span's ids and sampling decision (``_server_span.begin``), the call's
context attached and llmtrace's server scope entered around the handler; when the handler is
done, ``rpc.server.call.duration`` is recorded and — only for a sampled RPC — the finished span
is built on the span builder's thread. The servicer context is not wrapped: the status the
handler set (``set_code``, ``abort``) is read from it once, at the end. After the first message
of a streamed response the rest is delegated: nothing runs per message.

Status: ``rpc.grpc.status_code`` is 0 (OK), the code the handler set or aborted with, 2 (UNKNOWN)
for a handler that raised, 1 (CANCELLED) for an RPC the client cancelled, 4 (DEADLINE_EXCEEDED)
for one that ended by its deadline before the handler did. The span's status is
ERROR for the codes the RPC conventions make server errors (UNKNOWN, DEADLINE_EXCEEDED,
UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS), described ``StatusCode.X:details`` as
opentelemetry-instrumentation-grpc describes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from llmtrace import _runtime, semconv
from llmtrace._rpc_metrics import RpcServerMetrics, split_method
from llmtrace._safety import guarded, record_error
from llmtrace.integrations import _server_span
from llmtrace.integrations._server import Exchange
from llmtrace.integrations.grpc import extractors
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.clock import monotonic_ns, recent_offset_ns, to_wall_ns
from llmtrace.lifecycle.current import attach as context_attach
from llmtrace.lifecycle.current import current_context
from llmtrace.lifecycle.current import detach as context_detach
from llmtrace.lifecycle.pending import exception_event

_SERVER = SpanKind.SERVER
_UNSET = Status(StatusCode.UNSET)
OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED = 0, 1, 2, 4
#: Server-side errors by the RPC conventions (gRPC): UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED,
#: INTERNAL, UNAVAILABLE, DATA_LOSS. Other non-OK codes are the client's doing (UNSET).
ERROR_CODES = frozenset({2, 4, 12, 13, 14, 15})
_CODE_NAMES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
               5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
               9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
               14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


def in_server_span() -> bool:
    """Whether the current context's span is a SERVER span (the host's OpenTelemetry interceptor
    made one around ours): llmtrace's scope joins it."""
    current = current_context()
    if not current:  # an empty context, the usual case, holds no span
        return False
    span = trace.get_current_span(current)
    # One of ours is never around another RPC's handler: found here, it is a stale one (a
    # generator finalised where its context could not be reset), not a span to join.
    return (getattr(span, "kind", None) is _SERVER and not isinstance(span, _server_span.ServerSpan)
            and span.get_span_context().is_valid)


def _is_abort(error: BaseException) -> bool:
    """``context.abort()``: grpc raises a bare ``Exception`` (sync) or ``AbortError`` (aio)."""
    return type(error) is Exception or type(error).__name__ == "AbortError"


class Rpc:
    """One RPC under llmtrace's SERVER span."""

    __slots__ = ("_gone", "_live", "_metrics", "_recording", "code", "context", "deadline_ns", "details", "end_ns",
                 "error", "exchange", "method", "name", "offset", "peer", "start", "start_ns")

    def __init__(self, method: str, name: str, metadata: Any) -> None:
        self.start_ns = start = monotonic_ns()
        self.offset = offset = recent_offset_ns(start)
        self.method = method
        self.name = name
        self.start = opened = _server_span.begin(extractors.extract_context(metadata), name, start, offset)
        span, self._recording, _, self.context, _ = opened
        self._live = not isinstance(span, _server_span.ServerSpan)  # a live API span: ended in any case
        self.exchange = Exchange(span, start, offset, self.context)
        self.code: int | None = None  # set on a failure or a cancel; else read from the servicer context
        self.details: str | None = None
        self.deadline_ns: int | None = None  # when the client's deadline passes (monotonic), if it set one
        self._gone = False  # cancelled: its servicer context is not asked anything any more
        self.error: BaseException | None = None
        self.peer: str | None = None
        self.end_ns: int | None = None
        self._metrics: RpcServerMetrics | None = _runtime.rpc_metrics()

    # ----------------------------------------------------------------- while it runs
    def terminated(self) -> None:
        """Sync servers' termination callback: before the handler finished, the RPC was cancelled."""
        if not self.exchange.complete:
            self.cancelled()

    def cancelled(self) -> None:
        self._gone = True
        if self.code is None:
            self.code = CANCELLED
        self.exchange.disconnected()

    def ended_by(self, error: BaseException) -> None:
        """The handler ended with *error*: a closed response generator or a cancelled task is the
        RPC going away (cancelled); anything else, the handler failing."""
        if isinstance(error, (GeneratorExit, asyncio.CancelledError)):
            self.cancelled()
        else:
            self.failed(error)

    def failed(self, error: BaseException) -> None:
        if not _is_abort(error):
            self.error = error
            self.code = UNKNOWN
        self.exchange.finish(error)

    def first_message(self) -> None:
        self.exchange.first_byte(True)

    # ----------------------------------------------------------------- the end
    def close(self, servicer_context: Any) -> None:
        """The handler is done: the duration metric, and the span handed to the builder if sampled.
        (Its callers guard it: telemetry errors are counted, never raised.)"""
        end = self.end_ns = monotonic_ns()
        if not self.exchange.complete:
            self.exchange.finish()
        code = self.code
        if code is None:  # completed or aborted: the code the handler set, if any
            set_code = servicer_context.code()
            code = self.code = set_code.value[0] if set_code is not None else OK
        # Cancelled by the client, or by gRPC when the deadline passed: told apart by the deadline
        # read at arrival, since a cancelled RPC's servicer context is not asked anything
        # (grpc.aio crashed the process on time_remaining() there).
        elif code == CANCELLED and self.deadline_ns is not None and end >= self.deadline_ns:
            code = self.code = DEADLINE_EXCEEDED
        if self._metrics is not None:
            self._metrics.rpc_done((end - self.start_ns) * 1e-9, semconv.RPC_SYSTEM_GRPC, self.method, code)
        if self._recording or self._live:
            if code in ERROR_CODES and self.error is None and not self._gone:
                details = servicer_context.details()
                self.details = details.decode("utf-8", "replace") if isinstance(details, bytes) else details
            BUILDER.submit(self._build)

    def _build(self) -> None:
        code = self.code if self.code is not None else OK
        service, method = split_method(self.method)
        attributes: dict[str, Any] = {semconv.RPC_SYSTEM: semconv.RPC_SYSTEM_GRPC,
                                      semconv.RPC_GRPC_STATUS_CODE: code}
        if service:
            attributes[semconv.RPC_SERVICE] = service
        if method:
            attributes[semconv.RPC_METHOD] = method
        address = extractors.peer_address(self.peer) if self.peer else None
        if address is not None:
            attributes[semconv.CLIENT_ADDRESS] = address[0]
            if address[1] is not None:
                attributes[semconv.CLIENT_PORT] = address[1]
        status = _UNSET
        events = []
        end = self.end_ns if self.end_ns is not None else monotonic_ns()
        if code in ERROR_CODES:
            error = self.error
            attributes[semconv.ERROR_TYPE] = type(error).__qualname__ if error is not None else _CODE_NAMES[code]
            details = f"{type(error).__name__}: {error}" if error is not None else (self.details or "")
            status = Status(StatusCode.ERROR, f"StatusCode.{_CODE_NAMES[code]}:{details}")
            if error is not None:
                events.append(exception_event(error, timestamp=to_wall_ns(end, self.offset)))
        _server_span.finish(self.start, self.name, self.start_ns, end, self.offset, attributes, status, events)


@guarded("grpc.server_span", default=None)
def open_rpc(method: str, name: str, servicer_context: Any, sync: bool) -> tuple[Rpc, Any] | None:
    """An RPC's SERVER span begun, its context attached and its scope entered: ``(rpc, token)``."""
    rpc = Rpc(method, name, servicer_context.invocation_metadata())
    remaining = servicer_context.time_remaining()  # asked while the RPC is surely alive
    if remaining is not None:
        rpc.deadline_ns = rpc.start_ns + int(remaining * 1e9)
    if rpc._recording or rpc._live:
        rpc.peer = servicer_context.peer()
    if sync:
        servicer_context.add_callback(rpc.terminated)  # runs at termination; a no-op once complete
    token = context_attach(rpc.context)
    rpc.exchange.enter(findable=False)
    return rpc, token


def end_rpc(rpc: Rpc, token: Any, servicer_context: Any) -> None:
    """Leave the RPC's scope and context, then close it (never raises)."""
    rpc.exchange.exit()
    try:  # noqa: SIM105 - contextlib.suppress would add two calls to every RPC
        context_detach(token)
    except ValueError:  # finalised in another context (a generator closed elsewhere)
        pass
    try:
        rpc.close(servicer_context)
    except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host
        record_error("grpc.server_span_close", exc)


# --------------------------------------------------------------------------- behaviors
Behavior = Callable[..., Any]


def unary(behavior: Behavior, joined: Behavior, method: str) -> Behavior:
    """A sync unary-response behavior under its SERVER span (*joined*: the scope-only one)."""
    name = extractors.server_span_name(method)

    def traced(request: Any, context: Any) -> Any:
        if in_server_span():
            return joined(request, context)
        opened = open_rpc(method, name, context, True)
        if opened is None:
            return behavior(request, context)
        rpc, token = opened
        try:
            return behavior(request, context)
        except BaseException as exc:
            rpc.ended_by(exc)
            raise
        finally:
            end_rpc(rpc, token, context)

    return traced


def streaming(behavior: Behavior, joined: Behavior, method: str) -> Behavior:
    """A sync streaming-response behavior under its SERVER span."""
    name = extractors.server_span_name(method)

    def traced(request: Any, context: Any) -> Iterator[Any]:
        if in_server_span():
            return joined(request, context)  # type: ignore[no-any-return]
        return _stream(behavior, request, context, method, name)

    return traced


def _stream(behavior: Behavior, request: Any, context: Any, method: str, name: str) -> Iterator[Any]:
    opened = open_rpc(method, name, context, True)
    if opened is None:
        yield from behavior(request, context)
        return
    rpc, token = opened
    try:
        messages = iter(behavior(request, context))
        for message in messages:
            rpc.first_message()
            yield message
            break
        # The rest is delegated (and closed with this generator): no Python-level step per message.
        yield from messages
    except BaseException as exc:
        rpc.ended_by(exc)
        raise
    finally:
        end_rpc(rpc, token, context)


def aio_unary(behavior: Behavior, joined: Behavior, method: str) -> Behavior:
    """A ``grpc.aio`` coroutine behavior (a unary response, or one written with ``context.write``)."""
    name = extractors.server_span_name(method)

    async def traced(request: Any, context: Any) -> Any:
        if in_server_span():
            return await joined(request, context)
        opened = open_rpc(method, name, context, False)
        if opened is None:
            return await behavior(request, context)
        rpc, token = opened
        try:
            return await behavior(request, context)
        except BaseException as exc:
            rpc.ended_by(exc)
            raise
        finally:
            end_rpc(rpc, token, context)

    return traced


def aio_streaming(behavior: Behavior, joined: Behavior, method: str) -> Behavior:
    """A ``grpc.aio`` async-generator behavior under its SERVER span."""
    name = extractors.server_span_name(method)

    async def traced(request: Any, context: Any) -> AsyncIterator[Any]:
        if in_server_span():
            async for message in joined(request, context):
                yield message
            return
        opened = open_rpc(method, name, context, False)
        if opened is None:
            async for message in behavior(request, context):
                yield message
            return
        rpc, token = opened
        try:
            first = True
            async for message in behavior(request, context):
                if first:  # one test per message, no call: a streamed response has one per token
                    first = False
                    rpc.first_message()
                yield message
        except BaseException as exc:
            rpc.ended_by(exc)
            raise
        finally:
            end_rpc(rpc, token, context)

    return traced


