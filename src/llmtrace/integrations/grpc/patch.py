"""Wiring of the gRPC server integration.

Reuses opentelemetry-instrumentation-grpc for the SERVER span (its instrumentor
wraps ``grpc.server`` to put its interceptor first); llmtrace appends its own
interceptor (innermost, inside the SERVER span) that opens the server scope per
RPC, times the first streamed response message, and ends the RPC's open requests
as ``abort`` when the RPC terminates before its handler completed (the client
cancelled or went away).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from llmtrace import _runtime
from llmtrace._safety import guarded
from llmtrace.integrations import _server
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.grpc import _constants, extractors

INTEGRATION = "grpc"


def _unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    def traced(request: Any, context: Any) -> Any:
        exchange = _server.Exchange()
        context.add_callback(exchange.disconnected)  # runs at termination; a no-op once finished
        exchange.enter()
        try:
            response = behavior(request, context)
        except BaseException as exc:
            exchange.finish(exc)
            raise
        finally:
            exchange.exit()
        exchange.finish()
        return response

    return traced


def _streaming(behavior: Callable[..., Any]) -> Callable[..., Any]:
    def traced(request: Any, context: Any) -> Iterator[Any]:
        exchange = _server.Exchange()
        context.add_callback(exchange.disconnected)
        exchange.enter()
        try:
            for message in behavior(request, context):
                if exchange.scope.first_byte_ns is None:
                    exchange.first_byte(True)
                yield message
        except GeneratorExit:
            exchange.disconnected()
            raise
        except BaseException as exc:
            exchange.finish(exc)
            raise
        finally:
            exchange.exit()
        exchange.finish()

    return traced


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
        from opentelemetry.instrumentation.grpc import GrpcInstrumentorServer

        signature = inspect.signature(grpc.server)  # the library's, before OTel replaces it
        providers = _runtime.current().providers
        otel: Any = GrpcInstrumentorServer  # untyped upstream
        otel().instrument(tracer_provider=providers.tracer_provider if providers else None)
        self.patches.wrap(_constants.MODULE, _constants.SERVER, _server_wrapper(signature, _interceptor_class()()))
        _server.ENABLED.add(INTEGRATION)

    def _unpatch(self) -> None:
        from opentelemetry.instrumentation.grpc import GrpcInstrumentorServer

        _server.ENABLED.discard(INTEGRATION)
        self.patches.restore()  # ours first: it wraps OTel's replacement of grpc.server
        otel: Any = GrpcInstrumentorServer
        otel().uninstrument()
