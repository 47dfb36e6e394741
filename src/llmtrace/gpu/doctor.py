"""``llmtrace doctor``: what this machine gives llmtrace to work with.

Reports the NVML library and driver, the GPUs and how ``CUDA_VISIBLE_DEVICES`` maps them
to this process, which NVML queries each mapped device answers (and how long each
takes), where the spans go — a file, or an OTLP collector, checked for a TCP
connection — and the installed versions of the libraries llmtrace integrates with.
The command itself (``llmtrace.cli._doctor``) resolves the configuration and prints.

No GPU is not an error: it is reported, and llmtrace works without one.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from llmtrace._registry import REGISTRY
from llmtrace.gpu._queries import QUERIES
from llmtrace.gpu.backend import NvmlBackend, NvmlUnavailable, PynvmlBackend, QueryNotSupported
from llmtrace.gpu.devices import resolve_devices

__all__ = ["INTEGRATIONS", "collect", "probe_queries", "render", "resolve_endpoint"]

#: The packages whose versions the doctor reports: every integration's library (from the
#: registry), and what llmtrace itself runs on.
INTEGRATIONS = (*(spec.distribution for spec in REGISTRY), "uvicorn", "opentelemetry-sdk", "nvidia-ml-py")
#: TCP connect timeout for the collector check; a local collector answers in < 1 ms.
CONNECT_TIMEOUT_S = 1.0
GRPC_PORT = 4317
HTTP_PORT = 4318


def probe_queries(backend: NvmlBackend, handle: object) -> dict[str, dict[str, Any]]:
    """Run every sampler query once: ``{"status": "ok"|"not supported"|"error", "us": wall µs,
    "cpu_us": this thread's CPU µs, "values": {...}}``."""
    out: dict[str, dict[str, Any]] = {}
    for query in QUERIES:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            values = query.read(backend, handle)
            out[query.name] = {
                "status": "ok",
                "us": round((time.perf_counter() - t0) * 1e6, 1),
                "cpu_us": round((time.thread_time() - c0) * 1e6, 1),
                "values": values,
            }
        except QueryNotSupported:
            out[query.name] = {"status": "not supported"}
        except Exception as exc:  # noqa: BLE001 - the doctor reports every failure, it never raises one
            out[query.name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    return out


def _nvml_section(backend: NvmlBackend, environ: Mapping[str, str]) -> dict[str, Any]:
    section: dict[str, Any] = {"library_found": False, "driver_version": None, "unavailable": None}
    section["cuda_visible_devices"] = environ.get("CUDA_VISIBLE_DEVICES")
    section["gpus"], section["mapped"] = [], []
    try:
        backend.init()
    except NvmlUnavailable as exc:
        section["unavailable"] = {"reason": exc.reason.value, "detail": exc.detail}
        section["library_found"] = exc.reason.value != "no_nvml_library"
        return section
    section["library_found"] = True
    try:
        section["driver_version"] = backend.driver_version()
        for index in range(backend.device_count()):
            handle = backend.handle_by_index(index)
            section["gpus"].append({"index": index, "uuid": backend.uuid(handle), "name": backend.name(handle)})
        for dev in resolve_devices(backend, "visible", environ):
            section["mapped"].append(
                {
                    "cuda_ordinal": dev.visible_index,
                    "hw.gpu.id": dev.device_id,
                    "uuid": dev.uuid,
                    "name": dev.name,
                    "mig": dev.is_mig,
                    "queries": probe_queries(backend, dev.handle),
                }
            )
        if not section["gpus"]:
            section["unavailable"] = {"reason": "no_gpu", "detail": "the NVIDIA driver reports no GPU"}
        elif not section["mapped"]:
            section["unavailable"] = {
                "reason": "no_visible_device",
                "detail": "CUDA_VISIBLE_DEVICES hides them all",
            }
    except Exception as exc:  # noqa: BLE001 - telemetry never raises into the host
        section["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        backend.shutdown()
    return section


def resolve_endpoint(endpoint: str | None, environ: Mapping[str, str]) -> tuple[str, str, int]:
    """(as given, host, port) of the OTLP endpoint: argument, ``LLMTRACE_ENDPOINT``,
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, else localhost
    on the protocol's default port (4317 gRPC, 4318 HTTP)."""
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    default_port = HTTP_PORT if protocol.startswith("http") else GRPC_PORT
    raw = (
        endpoint
        or environ.get("LLMTRACE_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or f"localhost:{default_port}"
    )
    parsed = urllib.parse.urlsplit(raw if "://" in raw else f"//{raw}")
    try:
        port = parsed.port or default_port
    except ValueError:
        port = default_port
    return raw, parsed.hostname or "localhost", port


def _collector_section(endpoint: str | None, environ: Mapping[str, str]) -> dict[str, Any]:
    raw, host, port = resolve_endpoint(endpoint, environ)
    section: dict[str, Any] = {"endpoint": raw, "host": host, "port": port, "reachable": False, "error": None}
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            section["reachable"] = True
            section["connect_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    except OSError as exc:
        section["error"] = f"{type(exc).__name__}: {exc}"
    return section


def _integrations() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for dist in INTEGRATIONS:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def collect(
    endpoint: str | None = None,
    *,
    exporters: Sequence[str] = ("otlp",),
    backend: NvmlBackend | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything the doctor reports, as a JSON-ready dict.

    *exporters* are where llmtrace sends spans (``Settings.exporters``: ``otlp``,
    ``file:PATH``, ``console``); the collector is checked when one of them is ``otlp`` or
    *endpoint* names one, else ``"collector"`` is None.
    """
    env = os.environ if environ is None else environ
    try:
        version = importlib.metadata.version("llmtrace")
    except importlib.metadata.PackageNotFoundError:
        version = None
    checked = endpoint is not None or "otlp" in exporters
    return {
        "llmtrace": version,
        "nvml": _nvml_section(backend if backend is not None else PynvmlBackend(), env),
        "exporters": list(exporters),
        "collector": _collector_section(endpoint, env) if checked else None,
        "integrations": _integrations(),
    }


def _render_nvml(nvml: Mapping[str, Any]) -> list[str]:
    lines = [f"NVML library:      {'found' if nvml['library_found'] else 'NOT FOUND'}"]
    lines.append(f"Driver:            {nvml['driver_version'] or '-'}")
    lines.append(f"CUDA_VISIBLE_DEVICES: {nvml['cuda_visible_devices']!r}")
    if nvml["unavailable"]:
        why = nvml["unavailable"]
        lines.append(f"GPU telemetry:     off — {why['reason']}: {why['detail']}")
    for gpu in nvml["gpus"]:
        lines.append(f"  GPU {gpu['index']}: {gpu['name']} {gpu['uuid']}")
    for dev in nvml["mapped"]:
        mig = " (MIG)" if dev["mig"] else ""
        lines.append(f"  cuda:{dev['cuda_ordinal']} -> hw.gpu.id={dev['hw.gpu.id']}{mig} {dev['uuid']}")
        for name, result in dev["queries"].items():
            ok = result["status"] == "ok"
            detail = f"{result['us']} µs ({result['cpu_us']} µs CPU)" if ok else result.get("error", "")
            lines.append(f"      {name:<18} {result['status']:<14} {detail}")
    if "error" in nvml:
        lines.append(f"NVML error:        {nvml['error']}")
    return lines


def _render_export(exporters: Sequence[str], col: Mapping[str, Any] | None) -> list[str]:
    lines = []
    for kind in exporters:
        if kind.startswith("file:"):
            path = kind[5:]
            where = "" if os.path.isabs(path) else " (in the traced process's working directory)"
            lines.append(f"Traces to:         file {path}{where}")
        elif kind == "console":
            lines.append("Traces to:         stderr (console exporter)")
        else:
            lines.append("Traces to:         the OTLP collector below")
    if not exporters:
        lines.append("Traces to:         nowhere (exporter none)")
    if col is None:
        lines.append("Collector:         none configured (LLMTRACE_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT sets one)")
    else:
        state = f"reachable ({col.get('connect_ms')} ms)" if col["reachable"] else f"UNREACHABLE ({col['error']})"
        lines.append(f"Collector {col['host']}:{col['port']} ({col['endpoint']}): {state}")
    return lines


def render(report: Mapping[str, Any]) -> str:
    """The human-readable report."""
    lines = [f"llmtrace {report['llmtrace'] or '(not installed)'} doctor", ""]
    lines += _render_nvml(report["nvml"])
    lines += ["", *_render_export(report["exporters"], report["collector"]), "", "Integrations:"]
    for dist, version in report["integrations"].items():
        lines.append(f"  {dist:<20} {version or '-'}")
    return "\n".join(lines)
