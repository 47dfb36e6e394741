"""Pure helpers of the gRPC integration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple
from urllib.parse import unquote

from opentelemetry import context as otel_context
from opentelemetry import propagate

from llmtrace.integrations import _server_span
from llmtrace.lifecycle.current import NO_PARENT

#: The module of OpenTelemetry's gRPC interceptors (a server that holds one keeps its SERVER span).
_OTEL_MODULE = "opentelemetry.instrumentation.grpc"


class Behavior(NamedTuple):
    """Which behavior of an RPC method handler runs, and its shape."""

    attribute: str
    request_streaming: bool
    response_streaming: bool


def behavior_of(handler: Any) -> Behavior:
    request_streaming = bool(handler.request_streaming)
    response_streaming = bool(handler.response_streaming)
    prefix = ("stream" if request_streaming else "unary") + "_" + ("stream" if response_streaming else "unary")
    return Behavior(prefix, request_streaming, response_streaming)


def is_otel_interceptor(interceptor: Any) -> bool:
    return type(interceptor).__module__.startswith(_OTEL_MODULE)


def with_interceptor(interceptors: Iterable[Any] | None, interceptor: Any, first: bool = False) -> list[Any]:
    """*interceptors* with ours: last (innermost, inside someone else's SERVER span), or — *first*,
    where ours makes the SERVER span — outermost, yet after any OpenTelemetry interceptor, whose
    SERVER span ours then joins (never two)."""
    result = list(interceptors or ())
    if any(type(i) is type(interceptor) for i in result):
        return result
    if not first:
        result.append(interceptor)
        return result
    otel = [index for index, existing in enumerate(result) if is_otel_interceptor(existing)]
    result.insert(otel[-1] + 1 if otel else 0, interceptor)
    return result


def server_span_name(full_method: str) -> str:
    """``/package.Service/Method`` -> ``package.Service/Method`` (the RPC conventions' span name)."""
    return full_method.lstrip("/") or "grpc"


def peer_address(peer: str) -> tuple[str, int | None] | None:
    """``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000`` (or ``ipv6:%5B::1%5D:5000``) -> (address, port);
    None for a Unix socket or anything else."""
    kind, _, rest = peer.partition(",")[0].partition(":")
    if kind not in ("ipv4", "ipv6") or not rest:
        return None
    address, _, port = unquote(rest).rpartition(":")
    if not address:
        return None
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return address, int(port) if port.isdigit() else None


# --------------------------------------------------------------------------- context
def extract_context(metadata: Iterable[tuple[str, Any]] | None) -> otel_context.Context:
    """The caller's context from an RPC's invocation metadata, through the global propagator. An
    RPC whose metadata carries none of the propagator's keys gets the empty context without
    calling it (``NO_PARENT``)."""
    if not metadata:
        return NO_PARENT
    propagator = propagate.get_global_textmap()
    cached = _server_span.fields_cache
    if cached is not None and cached[0] is propagator:
        fields = cached[1]
    else:
        fields = _server_span.propagation_fields(propagator)
    wanted = None if fields is None else fields.text
    carrier: dict[str, str] | None = None
    for key, value in metadata:
        if (wanted is None or key in wanted) and isinstance(value, str):  # -bin values are bytes
            if carrier is None:
                carrier = {}
            carrier[key] = f"{carrier[key]},{value}" if key in carrier else value
    if carrier is None:
        return NO_PARENT
    return propagator.extract(carrier, context=otel_context.Context())
