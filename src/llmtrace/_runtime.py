"""Process-wide llmtrace state: the resolved settings, the tracer and the serving metrics.

Everything below ``instrument()`` reads its configuration from here, so that the
lifecycle API also works (with defaults, through OTel's global providers) when a
custom server uses it without calling ``instrument()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace

from llmtrace._version import __version__
from llmtrace.config import Settings

if TYPE_CHECKING:
    from llmtrace._http_metrics import HttpServerMetrics
    from llmtrace._otel.providers import Providers
    from llmtrace._rpc_metrics import RpcServerMetrics

TRACER_NAME = "llmtrace"


class ServingMetrics(Protocol):
    """What the lifecycle core records into (``lifecycle.metrics.ServingMetrics``).

    A protocol rather than an import: the runtime sits below the lifecycle modules, which
    import it, so it may not import them back."""

    #: Whether :meth:`record_request` is cheap enough for the request path (list appends, no SDK
    #: instrument): an unsampled request's metrics are then recorded where it ends.
    records_inline: bool

    def record_error(self, site: str) -> None: ...

    def record_request(self, rec: Any) -> None: ...

    def record_window(self, engine_id: str, totals: Any) -> None: ...


@dataclass
class Runtime:
    settings: Settings
    providers: Providers | None
    metrics: ServingMetrics | None
    http_metrics: HttpServerMetrics | None = None
    rpc_metrics: RpcServerMetrics | None = None


_DEFAULT = Runtime(settings=Settings(), providers=None, metrics=None)
_current: Runtime = _DEFAULT


def current() -> Runtime:
    return _current


def install(runtime: Runtime) -> None:
    global _current
    _current = runtime


def reset() -> None:
    global _current
    _current = _DEFAULT


def settings() -> Settings:
    return _current.settings


def tracer_provider() -> Any:
    return _current.providers.tracer_provider if _current.providers else trace.get_tracer_provider()


_tracer_cache: tuple[Any, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """llmtrace's tracer from the current provider, made once per provider: the SDK's
    ``get_tracer`` builds a new tracer and scope on every call (~18 µs here, as much as a
    span), and this runs for every request and every live span."""
    global _tracer_cache
    provider = tracer_provider()
    cached = _tracer_cache
    if cached is not None and cached[0] is provider:
        return cached[1]
    made: trace.Tracer = provider.get_tracer(TRACER_NAME, __version__)
    _tracer_cache = (provider, made)  # one tuple store: readers on other threads see old or new
    return made


def serving_metrics() -> ServingMetrics | None:
    return _current.metrics


def http_metrics() -> HttpServerMetrics | None:
    return _current.http_metrics


def rpc_metrics() -> RpcServerMetrics | None:
    return _current.rpc_metrics
