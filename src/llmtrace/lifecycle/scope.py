"""The server scope: what a network handler knows about the call it is serving.

A network integration (ASGI, aiohttp, gRPC) opens one :class:`ServerScope` per
incoming call, inside the SERVER span. Everything that happens for that call in
the same context (contextvars: asyncio tasks inherit it; threads get it through
the integrations that hand work to them) can find it:

* a request opened in the handler (``start_request`` or ``generate()``) registers
  here, so that a client disconnect ends it as ``abort`` and the scope's arrival
  time is the request's arrival;
* a prompt encoded before any request exists is parked here and adopted by the
  request that ``generate()`` opens next (so ``llm.tokenize`` sits under
  ``llm.request``); whatever no request adopts becomes an ``llm.tokenize`` span
  under the SERVER span when the scope closes.

The hot path touches the scope with a contextvar read and a list append. Most calls
open no request and park no encode (a health check, a model list, or a server whose engine
opens its requests elsewhere), so a scope's containers are made when first needed: the
shared empty ones it starts with are never mutated.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from llmtrace import semconv
from llmtrace._safety import guarded
from llmtrace.lifecycle.clock import monotonic_ns, offset_ns

if TYPE_CHECKING:
    from llmtrace.lifecycle.request import RequestHandle

_current_scope: contextvars.ContextVar[ServerScope | None] = contextvars.ContextVar(
    "llmtrace_server_scope", default=None
)


@dataclass
class PendingTokenize:
    """A prompt encode that happened before its request existed."""

    start_ns: int
    end_ns: int
    tokens: int
    batch: int
    tokenizer_class: str
    text: str | None


@dataclass
class DeferredFinish:
    """How a request opened by ``generate()`` ended; applied when the response is complete."""

    reason: str
    output_tokens: int | None
    completion: str | None


#: The containers every scope starts with, shared and never mutated (see the module docstring).
_NO_HANDLES: tuple[()] = ()
_NO_PENDING: tuple[()] = ()
_NO_DEFERRED: dict[int, DeferredFinish] = {}  # a read-only sentinel: only defer_finish() replaces it


class ServerScope:
    """One incoming call, from the network handler's point of view."""

    __slots__ = ("arrival_ns", "closed", "closed_ns", "context", "deferred", "first_byte_ns", "handles", "pending",
                 "recording", "wall_offset_ns")

    def __init__(self, arrival_ns: int | None = None, context: otel_context.Context | None = None,
                 wall_offset_ns: int | None = None, recording: bool | None = None) -> None:
        self.arrival_ns = monotonic_ns() if arrival_ns is None else arrival_ns
        #: The offset this call's spans are converted with, the requests opened in it included
        #: (one span tree, one offset: see lifecycle/clock.py).
        self.wall_offset_ns = offset_ns() if wall_offset_ns is None else wall_offset_ns
        self.context = otel_context.get_current() if context is None else context
        self.handles: list[RequestHandle] | tuple[()] = _NO_HANDLES
        self.pending: list[PendingTokenize] | tuple[()] = _NO_PENDING
        self.deferred: dict[int, DeferredFinish] = _NO_DEFERRED
        self.first_byte_ns: int | None = None
        self.closed = False
        self.closed_ns: int | None = None
        #: Whether anything of this call is sampled: its span (the SERVER span; *recording*, or
        #: read from *context*) or a request opened in it. A plain attribute, kept by
        #: :meth:`register`: it is read per streamed token (a decode's time is only worth taking
        #: when it lands on a span), by the compiled tokenizer methods too; a span's sampling
        #: decision never changes.
        self.recording = (trace.get_current_span(self.context).is_recording() if recording is None
                          else recording)

    # ------------------------------------------------------------------ requests
    def register(self, handle: RequestHandle) -> None:
        if handle.recording:
            self.recording = True
        if self.handles:
            self.handles.append(handle)  # non-empty: the scope's own list (an empty tuple is falsy)
        else:
            self.handles = [handle]

    def park(self, encode: PendingTokenize) -> None:
        """Keep a prompt encode that happened before its request existed (see :meth:`adopt_pending`)."""
        if self.pending:
            self.pending.append(encode)  # non-empty: the scope's own list (an empty tuple is falsy)
        else:
            self.pending = [encode]

    def open_handles(self) -> list[RequestHandle]:
        return [h for h in self.handles if h.finish_ns is None]

    def defer_finish(self, handle: RequestHandle, finish: DeferredFinish) -> bool:
        """Keep *handle* open until the response is complete; False if the scope already closed."""
        if self.closed:
            return False
        if self.deferred is _NO_DEFERRED:
            self.deferred = {}
        self.deferred[id(handle)] = finish
        return True

    def take_pending(self) -> list[PendingTokenize]:
        pending, self.pending = self.pending, _NO_PENDING
        return list(pending)

    def adopt_pending(self, handle: RequestHandle) -> None:
        """Hand the prompt encodes parked so far to *handle*, the request they were for."""
        for item in self.take_pending():
            handle.tokenized(item.tokens, item.start_ns, item.end_ns)
            if item.text is not None and handle.prompt is None:
                handle.prompt = item.text

    # ------------------------------------------------------------------ endings
    @guarded("scope.abort")
    def abort_open(self, error: BaseException | None = None, reason: str | None = None) -> None:
        """The client went away (or the handler failed): end every open request of this call."""
        self.closed = True
        self.closed_ns = monotonic_ns()
        for handle in self.open_handles():
            self.deferred.pop(id(handle), None)
            handle.aborted(error, reason)

    @guarded("scope.close")
    def close(self, error: BaseException | None = None, emit: Callable[[ServerScope], None] | None = None) -> None:
        """The response is complete: apply deferred finishes, emit unclaimed tokenize work."""
        if self.closed:
            return
        self.closed = True
        self.closed_ns = now = monotonic_ns()
        for handle in self.open_handles():
            finish = self.deferred.pop(id(handle), None)
            if error is not None:
                handle.aborted(error, at_ns=now)
            elif finish is not None:
                handle.finished(finish.reason, output_tokens=finish.output_tokens,
                                completion=finish.completion, at_ns=now)
        if self.pending and emit is not None:
            emit(self)

    def attributes(self) -> dict[str, Any]:
        if self.first_byte_ns is None:
            return {}
        return {semconv.LLM_TIME_TO_FIRST_BYTE_S: (self.first_byte_ns - self.arrival_ns) * 1e-9}


def current_scope() -> ServerScope | None:
    """The server call this code runs for, if a network integration opened one."""
    return _current_scope.get()


#: The context variable itself, for compiled hooks that read it (llmtrace-native's tokenizer methods).
SCOPE_VAR = _current_scope
#: :func:`current_scope` without its Python frame: for hooks asked once per streamed token.
get_scope: Callable[[], ServerScope | None] = _current_scope.get
#: Make *scope* the current one; returns the token :func:`exit_scope` takes. The context
#: variable's own methods, bound: a network integration calls them once per call, without a frame.
enter_scope: Callable[[ServerScope], contextvars.Token[ServerScope | None]] = _current_scope.set
exit_scope: Callable[[contextvars.Token[ServerScope | None]], None] = _current_scope.reset
