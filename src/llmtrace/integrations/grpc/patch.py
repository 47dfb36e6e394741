"""Wiring of the gRPC server integration.

With ``server_spans="llmtrace"`` (the default) llmtrace's interceptor is the first of a server's
chain and makes the SERVER span of each RPC itself (``server_span.py``); OpenTelemetry's gRPC
instrumentors are not enabled. A server that holds OpenTelemetry's interceptor (the host enabled
that instrumentation) keeps its SERVER span: ours goes after it and only opens the server scope
inside it. With ``"otel"`` OpenTelemetry's instrumentors make the SERVER span and ours is appended
(innermost); with ``"off"`` ours only opens the scope. The scope interceptor opens the server scope
per RPC, times the first streamed response message, and ends the RPC's open requests as ``abort``
when the RPC terminates before its handler completed (the client cancelled or went away; in
``grpc.aio`` the handler's task is cancelled).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from llmtrace import _runtime
from llmtrace._safety import guarded
from llmtrace.integrations import _server
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.grpc import _constants, extractors, server_span

INTEGRATION = "grpc"


@contextmanager
def _rpc(context: Any = None) -> Iterator[_server.Exchange]:
    """One RPC's exchange around its handler: the scope entered while the handler runs; the
    handler's end finishes it, its exception ends it as ``error``, and the RPC going away — a
    response generator closed early, a grpc.aio handler task cancelled, or (sync) the RPC
    terminating first — as ``abort``."""
    exchange = _server.Exchange()
    if context is not None:
        context.add_callback(exchange.disconnected)  # sync: runs at termination; a no-op once finished
    exchange.enter()
    try:
        yield exchange
    except (GeneratorExit, asyncio.CancelledError):
        exchange.disconnected()
        raise
    except BaseException as exc:
        exchange.finish(exc)
        raise
    finally:
        exchange.exit()
    exchange.finish()


def _first_message(exchange: _server.Exchange) -> None:
    if exchange.scope.first_byte_ns is None:
        exchange.first_byte(True)


def _unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    def traced(request: Any, context: Any) -> Any:
        with _rpc(context):
            return behavior(request, context)

    return traced


def _streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
    def traced(request: Any, context: Any) -> Iterator[Any]:
        with _rpc(context) as exchange:
            messages = iter(behavior(request, context))
            for message in messages:
                _first_message(exchange)
                yield message
                break
            # The rest is delegated (and closed with this generator): no Python-level step per
            # message, where a streamed response has one per token.
            yield from messages

    return traced


def _aio_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def traced(request: Any, context: Any) -> Any:
        with _rpc():
            return await behavior(request, context)

    return traced


def _aio_streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def traced(request: Any, context: Any) -> AsyncIterator[Any]:
        with _rpc() as exchange:
            first = True
            async for message in behavior(request, context):
                if first:  # one test per message, no call: a streamed response has one per token
                    first = False
                    _first_message(exchange)
                yield message

    return traced


@guarded("grpc.aio_handler")
def _traced_aio_handler(grpc: Any, handler: Any, method: str | None) -> Any:
    """*handler* with its behavior wrapped: under a SERVER span of ours when *method* is given,
    else in the server scope only."""
    shape = extractors.behavior_of(handler)
    behavior = getattr(handler, shape.attribute)
    if shape.response_streaming and inspect.isasyncgenfunction(behavior):
        traced = _aio_streaming(behavior)
        if method is not None:
            traced = server_span.aio_streaming(behavior, traced, method)
    elif inspect.iscoroutinefunction(behavior):
        if shape.response_streaming:  # written through context.write(): the SERVER span only
            if method is None:
                return handler
            traced = server_span.aio_unary(behavior, behavior, method)
        else:
            traced = _aio_unary(behavior)
            if method is not None:
                traced = server_span.aio_unary(behavior, traced, method)
    else:  # a sync behavior run in the server's thread pool
        return handler
    factory = getattr(grpc, f"{shape.attribute}_rpc_method_handler")
    return factory(traced, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


@guarded("grpc.handler")
def _traced_handler(grpc: Any, handler: Any, method: str | None) -> Any:
    shape = extractors.behavior_of(handler)
    behavior = getattr(handler, shape.attribute)
    traced = _streaming(behavior) if shape.response_streaming else _unary(behavior)
    if method is not None:
        make = server_span.streaming if shape.response_streaming else server_span.unary
        traced = make(behavior, traced, method)
    factory = getattr(grpc, f"{shape.attribute}_rpc_method_handler")
    return factory(traced, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


class _Handlers:
    """Traced handlers by method, made once per handler a server returns for it (generic
    handlers return the same one for every RPC): no handler built per RPC. One entry per
    method that has a handler, replaced if the server returns another."""

    __slots__ = ("_by_method", "_trace", "spans")

    def __init__(self, trace: Callable[[Any, Any, str | None], Any], spans: bool) -> None:
        self._trace = trace
        self.spans = spans
        self._by_method: dict[str, tuple[Any, Any]] = {}

    def traced(self, grpc: Any, handler: Any, method: str) -> Any:
        cached = self._by_method.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        traced = self._trace(grpc, handler, method if self.spans else None) or handler
        self._by_method[method] = (handler, traced)
        return traced


def _interceptor_class() -> type:
    import grpc

    class ScopeInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
        """llmtrace's server interceptor (see the module docstring)."""

        def __init__(self, spans: bool = False) -> None:
            self.handlers = _Handlers(_traced_handler, spans)

        def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
            handler = continuation(details)
            if handler is None or INTEGRATION not in _server.ENABLED:
                return handler
            return self.handlers.traced(grpc, handler, details.method)

    return ScopeInterceptor


def _aio_interceptor_class() -> type:
    import grpc

    class AioScopeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        """llmtrace's ``grpc.aio`` server interceptor (see the module docstring)."""

        def __init__(self, spans: bool = False) -> None:
            self.handlers = _Handlers(_traced_aio_handler, spans)

        async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
            handler = await continuation(details)
            if handler is None or INTEGRATION not in _server.ENABLED:
                return handler
            return self.handlers.traced(grpc, handler, details.method)

    return AioScopeInterceptor


def _server_wrapper(signature: inspect.Signature, interceptor: Any, first: bool) -> Callable[..., Any]:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        arguments = _with_interceptor(signature, interceptor, first, args, kwargs)
        if arguments is None:
            return wrapped(*args, **kwargs)
        return wrapped(*arguments[0], **arguments[1])

    return wrapper


@guarded("grpc.interceptor")
def _with_interceptor(signature: inspect.Signature, interceptor: Any, first: bool, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    if "interceptors" not in signature.parameters:
        # Another wrapper of the function taking (*args, **kwargs) (OpenTelemetry's instrumentor,
        # enabled before llmtrace): grpc's own functions take interceptors third at the earliest.
        if len(args) > 2:
            return None
        return args, {**kwargs, "interceptors": extractors.with_interceptor(kwargs.get("interceptors"),
                                                                             interceptor, first)}
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # the host's own mistake: let grpc report it
    arguments = dict(bound.arguments)
    arguments["interceptors"] = extractors.with_interceptor(arguments.get("interceptors"), interceptor, first)
    return (), arguments


class GrpcInstrumentor(Instrumentor):
    name = "grpc"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def __init__(self) -> None:
        super().__init__()
        self._otel = False  # whether _patch enabled OpenTelemetry's instrumentors (server_spans="otel")

    def _patch(self) -> None:
        import grpc
        import grpc.aio

        # The library's signatures, before OTel replaces the functions; ours wrap OTel's
        # replacements, so our interceptor is appended after OTel put its own first.
        signature, aio_signature = inspect.signature(grpc.server), inspect.signature(grpc.aio.server)
        mode = _runtime.settings().server_spans
        if mode == "otel":
            from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, GrpcInstrumentorServer

            providers = _runtime.current().providers
            tracer_provider = providers.tracer_provider if providers else None
            otel: Any = GrpcInstrumentorServer  # untyped upstream
            otel().instrument(tracer_provider=tracer_provider)
            otel_aio: Any = GrpcAioInstrumentorServer
            otel_aio().instrument(tracer_provider=tracer_provider)
            self._otel = True
        spans = mode == "llmtrace"
        self.patches.wrap(_constants.MODULE, _constants.SERVER,
                          _server_wrapper(signature, _interceptor_class()(spans), spans))
        self.patches.wrap(_constants.AIO_MODULE, _constants.SERVER,
                          _server_wrapper(aio_signature, _aio_interceptor_class()(spans), spans))
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        _server.ENABLED.discard(INTEGRATION)
        self.patches.restore()  # ours first: they wrap OTel's replacements of the server functions
        if self._otel:
            from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, GrpcInstrumentorServer

            otel: Any = GrpcInstrumentorServer
            otel().uninstrument()
            otel_aio: Any = GrpcAioInstrumentorServer
            otel_aio().uninstrument()
            self._otel = False
