"""One incoming call as the network integrations see it (ASGI, aiohttp, gRPC).

Opens a :class:`~llmtrace.lifecycle.scope.ServerScope` inside the SERVER span —
llmtrace's own (``_server_span``) or the one an OpenTelemetry instrumentation made —
and adds what that span lacks: the time to the first byte of a streamed response, and
requests ended as ``abort`` when the client goes away.
"""

from __future__ import annotations

import contextvars
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from llmtrace import semconv
from llmtrace._safety import guarded
from llmtrace.integrations._common import emit_pending
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.clock import monotonic_ns, offset_ns, to_mono_ns
from llmtrace.lifecycle.scope import ServerScope, enter_scope, exit_scope

_current_exchange: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "llmtrace_exchange", default=None)

#: Network integrations that are on; middleware left in a live app after
#: ``uninstrument()`` checks it and passes calls straight through.
ENABLED: set[str] = set()


class Exchange:
    """The llmtrace side of one server call."""

    __slots__ = ("_exchange_token", "_token", "complete", "scope", "span")

    def __init__(self, span: trace.Span | None = None, arrival_ns: int | None = None, offset: int | None = None,
                 context: otel_context.Context | None = None, recording: bool | None = None) -> None:
        if span is None:  # inside a SERVER span someone else made (OpenTelemetry's middleware)
            span = trace.get_current_span()
            # The call arrived when the SERVER span started (before routing and body parsing).
            started = getattr(span, "start_time", None)
            offset = offset_ns()
            arrival_ns = min(to_mono_ns(started, offset), monotonic_ns()) if isinstance(started, int) else None
        self.span = span
        self.scope = ServerScope(arrival_ns=arrival_ns, context=context, wall_offset_ns=offset,
                                 recording=span.is_recording() if recording is None else recording)
        self.complete = False
        self._token: contextvars.Token[ServerScope | None] | None = None
        self._exchange_token: contextvars.Token[Exchange | None] | None = None

    def enter(self, findable: bool = True) -> None:
        """Make this call's scope current; *findable*: also :func:`current_exchange` (for an
        integration whose hooks look the call up, as aiohttp's response writes do)."""
        self._token = enter_scope(self.scope)
        if findable:
            self._exchange_token = _current_exchange.set(self)

    def exit(self) -> None:
        if self._token is not None:
            try:
                if self._exchange_token is not None:
                    _current_exchange.reset(self._exchange_token)
                exit_scope(self._token)
            except ValueError:  # a generator finalised in another context: nothing to restore there
                pass
            self._token = self._exchange_token = None

    @guarded("server.first_byte")
    def first_byte(self, streamed: bool) -> None:
        scope = self.scope
        if scope.first_byte_ns is not None:
            return
        scope.first_byte_ns = monotonic_ns()
        if streamed and self.span.is_recording():
            self.span.set_attribute(semconv.LLM_TIME_TO_FIRST_BYTE_S, (scope.first_byte_ns - scope.arrival_ns) * 1e-9)

    @guarded("server.disconnect")
    def disconnected(self, error: BaseException | None = None) -> None:
        """The client went away before the response was complete."""
        if not self.complete:
            self.complete = True
            self.scope.abort_open(None, semconv.FINISH_ABORT)
            _emit_later(self.scope)

    def finish(self, error: BaseException | None = None) -> None:
        """The response is complete (or the handler failed with *error*). Called once per call:
        a call that left nothing open costs a few attribute stores, without :func:`guarded`'s frame
        (nothing here can raise); closing what the call left open is guarded."""
        if self.complete:
            return
        self.complete = True
        scope = self.scope
        if scope.pending:
            scope.close(error, _emit_later)  # guarded
            return
        for handle in scope.handles:
            if handle.finish_ns is None:  # a request still open: close() ends it
                scope.close(error, _emit_later)  # guarded
                return
        # Nothing left open (the usual end: the handler finished its requests; or a health check,
        # a model list): what close() would do, without its frames.
        scope.closed = True
        scope.closed_ns = monotonic_ns()


def _emit_later(scope: ServerScope) -> None:
    if scope.pending:
        BUILDER.submit(lambda: emit_pending(scope))


def current_exchange() -> Exchange | None:
    """The server call this code runs for (set by the network integration's middleware)."""
    return _current_exchange.get()


async def run_in_exchange(exchange: Exchange, call: Any, is_disconnect: Any) -> Any:
    """Await *call()* inside *exchange*: a disconnect ends its requests as ``abort``, another
    exception as ``error`` (and propagates untouched), a normal return finishes them."""
    exchange.enter()
    try:
        result = await call()
    except BaseException as exc:
        if is_disconnect(exc):
            exchange.disconnected(exc)
        else:
            exchange.finish(exc)
        raise
    finally:
        exchange.exit()
    exchange.finish()
    return result
