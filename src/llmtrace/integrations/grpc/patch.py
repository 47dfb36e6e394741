"""Wiring of the gRPC server integration.

Reuses opentelemetry-instrumentation-grpc for the SERVER span (its instrumentors
wrap ``grpc.server`` and ``grpc.aio.server`` to put their interceptor first); llmtrace
appends its own interceptor (innermost, inside the SERVER span) that opens the server
scope per RPC, times the first streamed response message, and ends the RPC's open
requests as ``abort`` when the RPC terminates before its handler completed (the
client cancelled or went away; in ``grpc.aio`` the handler's task is cancelled).
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
from llmtrace.integrations.grpc import _constants, extractors

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
def _traced_aio_handler(grpc: Any, handler: Any) -> Any:
    shape = extractors.behavior_of(handler)
    behavior = getattr(handler, shape.attribute)
    if shape.response_streaming and inspect.isasyncgenfunction(behavior):
        traced = _aio_streaming(behavior)
    elif not shape.response_streaming and inspect.iscoroutinefunction(behavior):
        traced = _aio_unary(behavior)
    else:  # a sync behavior run in the server's thread pool, or one writing through context.write()
        return handler
    factory = getattr(grpc, f"{shape.attribute}_rpc_method_handler")
    return factory(traced, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


@guarded("grpc.handler")
def _traced_handler(grpc: Any, handler: Any) -> Any:
    shape = extractors.behavior_of(handler)
    behavior = getattr(handler, shape.attribute)
    traced = _streaming(behavior) if shape.response_streaming else _unary(behavior)
    factory = getattr(grpc, f"{shape.attribute}_rpc_method_handler")
    return factory(traced, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def _interceptor_class() -> type:
    import grpc

    class ScopeInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
        """llmtrace's server interceptor (see the module docstring)."""

        def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
            handler = continuation(details)
            if handler is None or INTEGRATION not in _server.ENABLED:
                return handler
            return _traced_handler(grpc, handler) or handler

    return ScopeInterceptor


def _aio_interceptor_class() -> type:
    import grpc

    class AioScopeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        """llmtrace's ``grpc.aio`` server interceptor (see the module docstring)."""

        async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
            handler = await continuation(details)
            if handler is None or INTEGRATION not in _server.ENABLED:
                return handler
            return _traced_aio_handler(grpc, handler) or handler

    return AioScopeInterceptor


def _server_wrapper(signature: inspect.Signature, interceptor: Any) -> Callable[..., Any]:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        arguments = _with_interceptor(signature, interceptor, args, kwargs)
        if arguments is None:
            return wrapped(*args, **kwargs)
        return wrapped(**arguments)

    return wrapper


@guarded("grpc.interceptor")
def _with_interceptor(signature: inspect.Signature, interceptor: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> dict[str, Any] | None:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # the host's own mistake: let grpc report it
    arguments = dict(bound.arguments)
    arguments["interceptors"] = extractors.with_interceptor(arguments.get("interceptors"), interceptor)
    return arguments


class GrpcInstrumentor(Instrumentor):
    name = "grpc"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def _patch(self) -> None:
        import grpc
        import grpc.aio
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, GrpcInstrumentorServer

        # The library's signatures, before OTel replaces the functions; ours wrap OTel's
        # replacements, so our interceptor is appended after OTel put its own first.
        signature, aio_signature = inspect.signature(grpc.server), inspect.signature(grpc.aio.server)
        providers = _runtime.current().providers
        tracer_provider = providers.tracer_provider if providers else None
        otel: Any = GrpcInstrumentorServer  # untyped upstream
        otel().instrument(tracer_provider=tracer_provider)
        otel_aio: Any = GrpcAioInstrumentorServer
        otel_aio().instrument(tracer_provider=tracer_provider)
        self.patches.wrap(_constants.MODULE, _constants.SERVER, _server_wrapper(signature, _interceptor_class()()))
        self.patches.wrap(_constants.AIO_MODULE, _constants.SERVER,
                          _server_wrapper(aio_signature, _aio_interceptor_class()()))
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorServer, GrpcInstrumentorServer

        _server.ENABLED.discard(INTEGRATION)
        self.patches.restore()  # ours first: they wrap OTel's replacements of the server functions
        otel: Any = GrpcInstrumentorServer
        otel().uninstrument()
        otel_aio: Any = GrpcAioInstrumentorServer
        otel_aio().uninstrument()
