"""``instrument()`` / ``uninstrument()`` / ``shutdown()``: configuration -> providers -> integrations."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics as otel_metrics

from llmtrace import _runtime, _sigterm
from llmtrace._otel import providers as otel_providers
from llmtrace._safety import add_error_listener, remove_error_listener
from llmtrace._version import __version__
from llmtrace.config import Settings, resolve
from llmtrace.integrations import _hooks
from llmtrace.lifecycle.builder import BUILDER

if TYPE_CHECKING:
    from llmtrace._http_metrics import HttpServerMetrics
    from llmtrace._rpc_metrics import RpcServerMetrics
    from llmtrace.lifecycle.metrics import ServingMetrics

log = logging.getLogger("llmtrace")

_lock = threading.Lock()
_handle: Instrumentation | None = None
_providers: otel_providers.Providers | None = None
_atexit_registered = False
#: The runtime's error counter, listening to internal errors while that runtime is installed:
#: replaced (not added to) by each instrument(), also in a forked child; removed by shutdown().
_error_listener: Callable[[str], None] | None = None


@dataclass
class Instrumentation:
    """What ``instrument()`` returns: the resolved settings and what is active."""

    settings: Settings
    providers: otel_providers.Providers
    gpu_sampler: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def integrations(self) -> list[str]:
        """Integrations patched so far (a library not imported yet is patched when it is)."""
        return _hooks.active()

    def flush(self, timeout_s: float = 5.0) -> bool:
        return flush(timeout_s)

    def uninstrument(self) -> None:
        uninstrument()

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        return shutdown(timeout_s)


def _start_gpu(settings: Settings) -> Any:
    if settings.gpu == "off":
        return None
    try:
        from llmtrace.gpu.sampler import start_sampler
    except ImportError:
        return None
    try:
        return start_sampler(interval_s=settings.gpu_interval_s, required=settings.gpu == "on")
    except Exception as exc:  # noqa: BLE001 - no GPU must never stop the service
        log.warning("llmtrace: GPU sampling unavailable: %s", exc)
        return None


def _register_gpu_metrics(sampler: Any, meter: Any) -> None:
    try:
        from llmtrace.gpu.metrics import register_gpu_metrics
    except ImportError:
        return
    try:
        register_gpu_metrics(meter, sampler)
    except Exception as exc:  # noqa: BLE001
        log.warning("llmtrace: GPU metrics unavailable: %s", exc)


#: The server metrics made for the providers of this process (see :func:`_server_metrics`).
_metrics_made: tuple[Any, ServingMetrics, HttpServerMetrics, RpcServerMetrics] | None = None


def _server_metrics(providers: Any, meter: Any) -> tuple[ServingMetrics, HttpServerMetrics, RpcServerMetrics]:
    """The request, HTTP and RPC metrics on *meter*, made once per *providers* (kept across
    ``uninstrument()``/``instrument()``): the SDK keeps the first instrument of a name on a meter,
    callbacks included, so observable instruments made again would never be observed — the
    first objects' would, with what they last held (``http.server.active_requests`` went
    missing after a re-instrument)."""
    global _metrics_made
    from llmtrace._http_metrics import HttpServerMetrics
    from llmtrace._rpc_metrics import RpcServerMetrics
    from llmtrace.lifecycle.metrics import ServingMetrics

    made = _metrics_made
    if made is None or made[0] is not providers:
        made = _metrics_made = (providers, ServingMetrics(meter, providers.drops, providers.histograms),
                                HttpServerMetrics(meter, providers.histograms),
                                RpcServerMetrics(meter, providers.histograms))
    return made[1], made[2], made[3]


def instrument(**options: Any) -> Instrumentation:
    """Turn llmtrace on: configure export, then patch every enabled integration.

    Idempotent: a second call returns the active handle (and warns if its
    options differ). See :mod:`llmtrace.config` for every option.
    """
    global _handle, _providers, _atexit_registered
    settings = resolve(options)  # raises ConfigError before anything changes
    with _lock:
        if _handle is not None:
            if options and options != _handle.options:
                log.warning("llmtrace: already instrumented; new options ignored (call uninstrument() first)")
            return _handle
        if _providers is None:
            explicit = bool({"exporter", "endpoint"} & set(options)) or _env_explicit()
            _providers = otel_providers.setup(settings, explicit_exporter=explicit)
        meter = _providers.meter_provider.get_meter("llmtrace", __version__)
        serving, http, rpc = _server_metrics(_providers, meter) if settings.metrics else (None, None, None)
        _listen_for_errors(serving.record_error if serving is not None else None)
        _runtime.install(_runtime.Runtime(settings=settings, providers=_providers, metrics=serving,
                                          http_metrics=http, rpc_metrics=rpc))
        sampler = _start_gpu(settings)
        if settings.metrics:
            _register_gpu_metrics(sampler, meter)
        _hooks.enable(settings)
        _handle = Instrumentation(settings=settings, providers=_providers, gpu_sampler=sampler, options=options)
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
        _sigterm.install(_flush_at_sigterm)
        return _handle


def _listen_for_errors(listener: Callable[[str], None] | None) -> None:
    global _error_listener
    if _error_listener is not None:
        remove_error_listener(_error_listener)
    _error_listener = listener
    if listener is not None:
        add_error_listener(listener)


def _env_explicit() -> bool:
    return bool(os.environ.get("LLMTRACE_EXPORTER") or os.environ.get("LLMTRACE_ENDPOINT"))


def uninstrument() -> None:
    """Remove every patch (the library's original functions are restored, by identity)."""
    global _handle
    with _lock:
        _hooks.disable()
        if _handle is not None and _handle.gpu_sampler is not None:
            _stop_gpu()
        _handle = None


def _stop_gpu() -> None:
    try:
        from llmtrace.gpu.sampler import stop_sampler
    except ImportError:
        return
    stop_sampler()


def _close_engine_windows() -> None:
    from llmtrace.lifecycle.engine import _ENGINES

    for engine in list(_ENGINES):
        engine.flush_window()


def flush(timeout_s: float = 5.0) -> bool:
    """Close open engine windows, build pending spans and export them, within *timeout_s*."""
    _close_engine_windows()
    ok = BUILDER.flush(timeout_s)
    if _providers is not None:
        ok = otel_providers.flush(_providers, timeout_s) and ok
    else:
        provider: Any = otel_metrics.get_meter_provider()
        if hasattr(provider, "force_flush"):
            provider.force_flush()
    return ok


def overhead_cpu_s() -> dict[str, float]:
    """CPU seconds llmtrace's own threads have spent in this process, by worker
    (``span_builder``, ``exporter``); also the metric ``llmtrace.overhead.cpu_time``.

    The hot-path costs (a timestamp per token, per lifecycle event, per engine step) run
    on the host's threads and are not in it; ``benchmarks/`` measures those per call."""
    return {"span_builder": BUILDER.cpu_s, "exporter": _providers.drops.cpu_s if _providers is not None else 0.0}


def shutdown(timeout_s: float = 5.0) -> bool:
    """Flush everything and stop llmtrace's exporters and threads; returns False on timeout."""
    global _providers
    deadline = time.monotonic() + timeout_s
    _close_engine_windows()
    uninstrument()
    ok = BUILDER.flush(timeout_s * 0.5)
    BUILDER.stop(max(0.01, deadline - time.monotonic()))
    with _lock:
        if _providers is not None:
            ok = otel_providers.shutdown(_providers, max(0.01, deadline - time.monotonic())) and ok
            _providers = None
        _runtime.reset()
        _listen_for_errors(None)
    return ok


def _at_exit() -> None:
    with contextlib.suppress(Exception):  # never turn interpreter exit into a traceback
        shutdown(timeout_s=3.0)


def _flush_at_sigterm(timeout_s: float) -> None:
    with contextlib.suppress(Exception):  # the process is going down either way
        shutdown(timeout_s=timeout_s)


def current() -> Instrumentation | None:
    return _handle


def _after_fork_in_child() -> None:
    # A forked worker inherits the parent's handle, but not its threads (the GPU sampler
    # stays off in the child). Forget the handle so that instrument() in the child runs
    # again — reusing the inherited providers, whose batch workers OTel restarts itself.
    global _handle
    _handle = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
