"""Every llmtrace option and environment variable, in one module.

Each option of :func:`llmtrace.instrument` has an environment variable named after
it (option ``exporter`` <-> ``LLMTRACE_EXPORTER``). Precedence, highest first:

1. keyword arguments to ``instrument()``;
2. ``LLMTRACE_*`` environment variables;
3. the standard ``OTEL_*`` variables where one applies (``OTEL_SERVICE_NAME``,
   ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``,
   ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_TRACES_SAMPLER(_ARG)``, ``OTEL_BSP_SCHEDULE_DELAY``,
   ``OTEL_METRIC_EXPORT_INTERVAL``);
   ``OTEL_RESOURCE_ATTRIBUTES`` is merged into the resource by the OTel SDK;
4. the defaults below.

An unknown option or an invalid value raises :class:`llmtrace.errors.ConfigError`
naming it and the allowed values. docs/configuration.md is generated from
:data:`OPTIONS` (``python -m llmtrace.config``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from llmtrace._registry import NAMES as INTEGRATION_NAMES
from llmtrace.errors import ConfigError

ENV_PREFIX = "LLMTRACE_"
PROTOCOLS = ("grpc", "http/protobuf", "http/json")
GPU_MODES = ("auto", "on", "off")
SERVER_SPAN_MODES = ("llmtrace", "otel", "off")
#: Every integration llmtrace knows; each is enabled by default when its library is importable.
KNOWN_INTEGRATIONS = INTEGRATION_NAMES
#: Written in the working directory when no endpoint is configured: the embedded default.
DEFAULT_FILE_PATH = "llmtrace-traces.jsonl"

Protocol = Literal["grpc", "http/protobuf", "http/json"]
GpuMode = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class Option:
    """One option: its parser, default and the sentence that documents it."""

    name: str
    parse: Callable[[str, Any], Any]
    default: Any
    doc: str
    otel_env: str | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name}: expected a non-empty string, got {value!r}")
    return value.strip()


def _opt_str(name: str, value: Any) -> str | None:
    return None if value is None or value == "" else _str(name, value)


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    # A choice that includes on/off is a switch with extra settings (gpu: auto, on, off), so a
    # boolean is read as on/off: instrument(gpu=True), LLMTRACE_GPU=false.
    switch = "on" in allowed and "off" in allowed

    def parse(name: str, value: Any) -> str:
        text = str(value).strip().lower()
        if switch and (isinstance(value, bool) or text in _TRUE + _FALSE):
            return "on" if _bool(name, value) else "off"
        if text not in allowed:
            booleans = " (or a boolean for on/off: true, false, 1, 0, yes, no)" if switch else ""
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(allowed)}{booleans}")
        return text

    return parse


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name}: {value!r} is not a boolean (allowed: true, false, 1, 0, yes, no, on, off)")


def _number(kind: type, low: float, high: float) -> Callable[[str, Any], Any]:
    def parse(name: str, value: Any) -> Any:
        try:
            number = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: {value!r} is not a {kind.__name__}") from None
        if not low <= number <= high:
            raise ConfigError(f"{name}: {value!r} is outside the allowed range [{low}, {high}]")
        return number

    return parse


def _exporter(name: str, value: Any) -> str:
    text = _str(name, value)
    for raw in text.split(","):
        item = raw.strip()
        if item in ("otlp", "console", "none", "file") or (item.startswith("file:") and len(item) > 5):
            continue
        raise ConfigError(f"{name}: {item!r} is not one of otlp, file:PATH, file, console, none "
                          "(several may be joined with commas, e.g. file,otlp)")
    return text


def _integrations(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else [str(v) for v in value]
    items = [v for v in items if v]
    unknown = [v for v in items if v not in KNOWN_INTEGRATIONS]
    if unknown:
        raise ConfigError(f"{name}: unknown integration {unknown[0]!r} (known: {', '.join(KNOWN_INTEGRATIONS)})")
    return tuple(items)


def _headers(name: str, value: Any) -> dict[str, str]:
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    result: dict[str, str] = {}
    for part in str(value).split(","):
        if not part.strip():
            continue
        key, sep, val = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name}: {part!r} is not key=value (format: k1=v1,k2=v2)")
        result[key.strip()] = val.strip()
    return result


OPTIONS: tuple[Option, ...] = (
    Option("service_name", _str, "llm-service", "`service.name` of the resource.", "OTEL_SERVICE_NAME"),
    Option("endpoint", _opt_str, None,
           "OTLP endpoint, e.g. `http://collector:4317` (grpc) or `http://collector:4318` (http). "
           "When unset and no exporter is chosen, spans go to the embedded default file.",
           "OTEL_EXPORTER_OTLP_ENDPOINT"),
    Option("protocol", _choice(*PROTOCOLS), "grpc",
           "OTLP protocol: `grpc`, `http/protobuf`, or `http/json` (llmtrace's own encoder: the "
           "cheapest on the exporting process's CPU).",
           "OTEL_EXPORTER_OTLP_PROTOCOL"),
    Option("headers", _headers, {}, "Headers sent with every OTLP export, `k1=v1,k2=v2`.",
           "OTEL_EXPORTER_OTLP_HEADERS"),
    Option("exporter", _exporter, None,
           "`otlp`, `file:PATH` (OTLP-JSON lines), `file` (the default path), `console` or `none`; "
           "several joined by commas (`file,otlp`). Default: `otlp` when an endpoint is set, else `file`."),
    Option("file_path", _str, DEFAULT_FILE_PATH, "Path of the embedded default OTLP-JSON-lines file."),
    Option("sample_ratio", _number(float, 0.0, 1.0), 1.0,
           "Share of request traces recorded (parent-based: a sampled caller is always honoured).",
           "OTEL_TRACES_SAMPLER_ARG"),
    Option("engine_sample_ratio", _number(float, 0.0, 1.0), 1.0,
           "Share of engine windows recorded; a sampled window keeps every step in it."),
    Option("engine_window_s", _number(float, 0.01, 3600.0), 1.0, "Length of one `llm.engine` window, seconds."),
    Option("engine_window_steps", _number(int, 1, 1_000_000), 256,
           "Maximum steps in one `llm.engine` window (a window closes at whichever limit comes first)."),
    Option("max_links", _number(int, 0, 128), 128, "Links from an `llm.step` to the request spans of its batch."),
    Option("integrations", _integrations, None,
           "Comma-separated integrations to enable (default: every available one of "
           f"{', '.join(KNOWN_INTEGRATIONS)})."),
    Option("disable", _integrations, (), "Comma-separated integrations to leave off."),
    Option("capture_content", _bool, False, "Record prompt and completion text (off by default)."),
    Option("capture_content_max_chars", _number(int, 1, 10_000_000), 2048,
           "Prompt/completion text is truncated to this many characters."),
    Option("gpu", _choice(*GPU_MODES), "auto", "GPU sampling: `auto` (when NVML finds a device), `on`, `off`."),
    Option("gpu_interval_s", _number(float, 0.001, 60.0), 0.1, "NVML sampling period, seconds."),
    Option("metrics", _bool, True, "Export serving and GPU metrics."),
    Option("metrics_interval_s", _number(float, 0.1, 3600.0), 10.0, "Metric export period, seconds.",
           "OTEL_METRIC_EXPORT_INTERVAL"),
    Option("span_export_interval_s", _number(float, 0.001, 3600.0), 1.0,
           "How long a span waits in the export queue at most, seconds: the exporter sends what is "
           "queued this often, and a full batch (512 spans) at once.", "OTEL_BSP_SCHEDULE_DELAY"),
    Option("max_queue_size", _number(int, 16, 10_000_000), 8192,
           "Spans held in memory for export at most; beyond it (or `max_queue_bytes`) a span goes to the "
           "spill (see `spill_max_bytes`), else it is dropped and counted (`llmtrace.spans.dropped`, "
           "`reason=queue_full`)."),
    Option("max_queue_bytes", _number(int, 65_536, 1 << 40), 32 * 1024 * 1024,
           "Bytes held in memory for export at most (estimated per span: 400 + 64 per attribute, event and "
           "link), besides `max_queue_size`. The spill's in-memory overflow holds a quarter of both bounds "
           "more."),
    Option("spill_dir", _opt_str, None,
           "Where OTLP export batches go while the endpoint fails, as rotated OTLP-JSON-lines files, re-sent "
           "when it is back (`llmtrace analyze DIR/*.jsonl` reads them in place). Default: "
           "`$XDG_STATE_HOME/llmtrace/spill` (`~/.local/state/llmtrace/spill`), else a directory under the "
           "system temporary directory. Several processes may share it."),
    Option("spill_max_bytes", _number(int, 0, 1 << 50), 256 * 1024 * 1024,
           "Disk bytes the spill may use; beyond it the oldest spans are deleted and counted as dropped "
           "(`reason=spill_full`). `0` turns the spill off (spans the endpoint refuses are dropped and counted)."),
    Option("gc_spans", _bool, True, "Emit `llm.gc` spans for garbage-collector pauses in engine windows."),
    Option("process_role", _str, "api-server",
           "`llmtrace.process.role` resource attribute (api-server, engine, worker)."),
    Option("server_spans", _choice(*SERVER_SPAN_MODES), "llmtrace",
           "Who makes the SERVER span of an ASGI app (FastAPI, Starlette, vLLM's API server), an aiohttp "
           "app or a gRPC server: "
           "`llmtrace` (its own, built off the request path; the `http.server.*` / `rpc.server.*` metrics "
           "for every request), `otel` (OpenTelemetry's instrumentation, exactly as that package emits it) "
           "or `off` (no SERVER span, no HTTP/RPC metrics). A server the host already instrumented with "
           "OpenTelemetry keeps that span in every mode; llmtrace joins it."),
    Option("excluded_urls", _opt_str, None,
           "Comma-separated regular expressions; an HTTP call whose URL matches one gets no SERVER span and "
           "no HTTP metrics (health checks). Added to `OTEL_PYTHON_EXCLUDED_URLS` and "
           "`OTEL_PYTHON_FASTAPI_EXCLUDED_URLS` / `OTEL_PYTHON_STARLETTE_EXCLUDED_URLS` / "
           "`OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS`, which are honoured too."),
    Option("response_headers", _bool, True,
           "On every traced HTTP response, a `traceresponse` header (W3C Trace Context Level 2) naming the "
           "trace, and on a non-streamed one `Server-Timing` with queue/prefill/decode/TTFT where known."),
)
_BY_NAME = {option.name: option for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    """The resolved configuration; build it with :func:`resolve`."""

    service_name: str = "llm-service"
    endpoint: str | None = None
    protocol: str = "grpc"
    headers: dict[str, str] = field(default_factory=dict)
    exporter: str = "file"
    file_path: str = DEFAULT_FILE_PATH
    sample_ratio: float = 1.0
    engine_sample_ratio: float = 1.0
    engine_window_s: float = 1.0
    engine_window_steps: int = 256
    max_links: int = 128
    integrations: tuple[str, ...] | None = None
    disable: tuple[str, ...] = ()
    capture_content: bool = False
    capture_content_max_chars: int = 2048
    gpu: str = "auto"
    gpu_interval_s: float = 0.1
    metrics: bool = True
    metrics_interval_s: float = 10.0
    span_export_interval_s: float = 1.0
    max_queue_size: int = 8192
    max_queue_bytes: int = 32 * 1024 * 1024
    spill_dir: str | None = None
    spill_max_bytes: int = 256 * 1024 * 1024
    gc_spans: bool = True
    process_role: str = "api-server"
    server_spans: str = "llmtrace"
    excluded_urls: str | None = None
    response_headers: bool = True

    def integration_enabled(self, name: str) -> bool:
        if name in self.disable:
            return False
        return self.integrations is None or name in self.integrations

    @property
    def exporters(self) -> list[str]:
        """Each exporter: ``otlp``, ``console`` or ``file:PATH`` (``none`` is left out)."""
        items = [item.strip() for item in self.exporter.split(",")]
        return [f"file:{self.file_path}" if item == "file" else item for item in items if item != "none"]

    @property
    def export_file(self) -> str | None:
        """The OTLP-JSON-lines path when exporting to a file, else None."""
        files = [item[5:] for item in self.exporters if item.startswith("file:")]
        return files[0] if files else None


assert {f.name for f in fields(Settings)} == set(_BY_NAME), "Settings and OPTIONS must list the same names"


def _otel_fallback(option: Option, environ: Mapping[str, str]) -> str | None:
    if option.otel_env is None:
        return None
    if option.name == "sample_ratio":
        return _ratio_from_otel_sampler(environ)
    value = environ.get(option.otel_env) or None
    if value is not None and option.otel_env in _OTEL_MILLISECONDS:
        try:
            return str(float(value) / 1000)
        except ValueError:
            raise ConfigError(f"{option.otel_env}: {value!r} is not a number of milliseconds") from None
    return value


#: OpenTelemetry's variables that give a period in milliseconds, where llmtrace's option takes seconds.
_OTEL_MILLISECONDS = frozenset({"OTEL_BSP_SCHEDULE_DELAY", "OTEL_METRIC_EXPORT_INTERVAL"})


def _ratio_from_otel_sampler(environ: Mapping[str, str]) -> str | None:
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not sampler:
        return None
    if sampler in ("always_on", "parentbased_always_on"):
        return "1.0"
    if sampler in ("always_off", "parentbased_always_off"):
        return "0.0"
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        return environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
    raise ConfigError(
        f"OTEL_TRACES_SAMPLER: {sampler!r} is not one of always_on, always_off, traceidratio, "
        "parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
    )


def resolve(overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Merge keyword options, environment and defaults into validated :class:`Settings`."""
    overrides = dict(overrides or {})
    environ = os.environ if environ is None else environ
    unknown = sorted(set(overrides) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r} (allowed: {', '.join(sorted(_BY_NAME))})")
    values: dict[str, Any] = {}
    for option in OPTIONS:
        if option.name in overrides and overrides[option.name] is not None:
            values[option.name] = option.parse(option.name, overrides[option.name])
        elif environ.get(option.env):
            values[option.name] = option.parse(option.env, environ[option.env])
        elif (fallback := _otel_fallback(option, environ)) is not None:
            name = option.otel_env or option.env
            if name in _OTEL_MILLISECONDS:
                name += " (in seconds)"  # a range error shows the value converted
            values[option.name] = option.parse(name, fallback)
        else:
            values[option.name] = option.default
    if values["exporter"] is None:
        values["exporter"] = "otlp" if values["endpoint"] else "file"
    return Settings(**values)


def markdown_table() -> str:
    """The configuration table of docs/configuration.md and the README."""
    rows = ["| option | environment | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        otel = option.otel_env
        unit = ", milliseconds" if otel in _OTEL_MILLISECONDS else ""
        env = f"`{option.env}`" + (f" (or `{otel}`{unit})" if otel else "")
        rows.append(f"| `{option.name}` | {env} | `{option.default!r}` | {option.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
