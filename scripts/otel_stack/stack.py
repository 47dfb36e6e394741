"""Start the collector + Jaeger on free loopback ports, read traces back, always stop them.

::

    with OtelStack.start() as stack:          # two Jaeger-binary processes
        app(endpoint=stack.otlp_grpc_endpoint)
        spans = stack.find_traces("my-service", span_name="llm.request")

The processes run the shipped files unchanged; :data:`TEST_SAMPLING` is what the
session stack substitutes besides ports (keep everything, decide after 2 s).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from scripts.otel_stack.binaries import REPO_ROOT, StackError, build_gateway_collector, build_jaeger

COLLECTOR_CONFIG = REPO_ROOT / "collector" / "otel-collector.yaml"
JAEGER_CONFIG = REPO_ROOT / "collector" / "jaeger.yaml"
GATEWAY_CONFIG = REPO_ROOT / "collector" / "gateway" / "tier1-loadbalancer.yaml"

HEALTH_TIMEOUT_S = 60.0  # first start of a 120 MB binary on a busy 2-core CI box
STOP_TIMEOUT_S = 10.0

#: Sampling knobs of the session stack: keep every trace, decide quickly.
TEST_SAMPLING: Mapping[str, str] = {
    "LLMTRACE_COLLECTOR_DECISION_WAIT": "2s",
    "LLMTRACE_COLLECTOR_BASELINE_PERCENT": "100",
    "LLMTRACE_COLLECTOR_ENGINE_PERCENT": "100",
    "LLMTRACE_COLLECTOR_BATCH_TIMEOUT": "200ms",
    "LLMTRACE_COLLECTOR_SPANMETRICS_FLUSH_INTERVAL": "1s",
}

# The binaries must not pick up the test process's own OTel settings.
_SCRUBBED_ENV_PREFIXES = ("OTEL_", "LLMTRACE_")

_LIVE: set[ManagedProcess] = set()
_PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> list[int]:
    """*count* distinct free loopback ports (all held open while choosing, so no duplicates)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


def _port_clash(err: StackError) -> bool:
    """Another process took a chosen port between choosing and binding (rare; retried once)."""
    return "address already in use" in str(err)


def _clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
    env.update(extra)
    return env


def _http_get(url: str, timeout_s: float = 5.0, data: bytes | None = None,
              headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def http_ok(url: str) -> Callable[[], bool]:
    """Readiness: GET *url* answers 200 (Jaeger's healthcheckv2 ``/status``)."""
    return lambda: _http_get(url, timeout_s=1.0)[0] == 200


def otlp_http_accepts(endpoint: str) -> Callable[[], bool]:
    """Readiness of a collector: an empty OTLP/JSON export to ``/v1/traces`` is accepted.

    The shipped collector config has no health-check extension (none is compiled
    into both otelcol-contrib and Jaeger), and a 200 here means the traces
    pipeline is running, which is what a test needs.
    """
    url = f"http://{endpoint}/v1/traces"
    headers = {"Content-Type": "application/json"}
    return lambda: _http_get(url, timeout_s=1.0, data=b"{}", headers=headers)[0] == 200


class ManagedProcess:
    """A binary with a log file and a readiness probe; stopped on :meth:`stop` or at interpreter exit."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], ready: Callable[[], bool],
                 log_dir: Path):
        self.name, self.argv, self.env, self.ready = name, argv, dict(env), ready
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        # Own session: a terminal Ctrl-C reaches pytest, which then stops us in order.
        # preexec_fn only calls prctl(), which is safe between fork and exec even with threads.
        self.proc = subprocess.Popen(argv, env=_clean_env(env), stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=REPO_ROOT, start_new_session=True,
                                     preexec_fn=_die_with_parent)  # noqa: PLW1509
        _LIVE.add(self)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StackError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if self.ready():
                    return
            time.sleep(0.1)
        raise StackError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        self._log.close()
        _LIVE.discard(self)


def _die_with_parent() -> None:
    """Linux: SIGTERM the binary if the test process dies without cleaning up (e.g. SIGKILL)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.stop()


# --------------------------------------------------------------------------- traces


_ANY_VALUE: dict[str, Callable[[Any], Any]] = {
    "stringValue": str,
    "intValue": int,  # int64 arrives as a JSON string
    "doubleValue": float,
    "boolValue": bool,
    "arrayValue": lambda v: [_any_value(item) for item in v.get("values", [])],
    "kvlistValue": lambda v: _attributes(v.get("values", [])),
}


def _any_value(value: Mapping[str, Any]) -> Any:
    """OTLP/JSON AnyValue -> Python."""
    for key, convert in _ANY_VALUE.items():
        if key in value:
            return convert(value[key])
    return None


def _attributes(items: list[Mapping[str, Any]]) -> dict[str, Any]:
    return {item["key"]: _any_value(item.get("value", {})) for item in items}


@dataclass(frozen=True)
class StackSpan:
    """One span as Jaeger's ``/api/v3/traces`` returned it."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(hash=False)
    resource: dict[str, Any] = field(hash=False)

    @property
    def service_name(self) -> str:
        return str(self.resource.get("service.name", ""))

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def parse_traces(document: Mapping[str, Any]) -> list[StackSpan]:
    """Flatten an ``/api/v3/traces`` response (``{"result": {"resourceSpans": [...]}}``)."""
    spans: list[StackSpan] = []
    for rs in document.get("result", {}).get("resourceSpans", []):
        resource = _attributes(rs.get("resource", {}).get("attributes", []))
        for ss in rs.get("scopeSpans", []):
            for raw in ss.get("spans", []):
                spans.append(StackSpan(
                    trace_id=raw["traceId"], span_id=raw["spanId"],
                    parent_span_id=raw.get("parentSpanId", ""),
                    name=raw["name"], kind=int(raw.get("kind", 0)),
                    start_ns=int(raw.get("startTimeUnixNano", 0)), end_ns=int(raw.get("endTimeUnixNano", 0)),
                    status_code=int(raw.get("status", {}).get("code", 0)),
                    attributes=_attributes(raw.get("attributes", [])), resource=resource,
                ))
    return spans


def by_trace(spans: list[StackSpan]) -> dict[str, list[StackSpan]]:
    traces: dict[str, list[StackSpan]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def collector_env_for(sampling: Mapping[str, str], grpc: int, http: int, prom: int, telemetry: int,
                      jaeger_endpoint: str) -> dict[str, str]:
    """The environment collector/otel-collector.yaml reads: its loopback ports, the Jaeger it
    exports to (``host:port`` of Jaeger's OTLP/gRPC), and the tail-sampling settings."""
    return {
        **sampling,
        "LLMTRACE_COLLECTOR_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "LLMTRACE_COLLECTOR_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
        "LLMTRACE_COLLECTOR_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom}",
        "LLMTRACE_COLLECTOR_TELEMETRY_HOST": "127.0.0.1",
        "LLMTRACE_COLLECTOR_TELEMETRY_PORT": str(telemetry),
        "LLMTRACE_COLLECTOR_JAEGER_ENDPOINT": jaeger_endpoint,
    }


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def query_traces(jaeger_query_url: str, service: str, span_name: str | None = None,
                 since: datetime | None = None, limit: int = 1000) -> list[StackSpan]:
    """One ``/api/v3/traces`` call; 404 (no match) is an empty list."""
    now = datetime.now(timezone.utc)
    params = {
        "query.service_name": service,
        "query.start_time_min": _rfc3339(since or now - timedelta(hours=1)),
        "query.start_time_max": _rfc3339(now + timedelta(minutes=1)),
        "query.num_traces": str(limit),
    }
    if span_name:
        params["query.operation_name"] = span_name
    status, body = _http_get(f"{jaeger_query_url}/api/v3/traces?{urllib.parse.urlencode(params)}")
    if status == 404:
        return []
    if status != 200:
        raise StackError(f"Jaeger /api/v3/traces answered {status}: {body[:500]!r}")
    return parse_traces(json.loads(body))


# --------------------------------------------------------------------------- the stack

#: The ports of one stack: j_* Jaeger (collector/jaeger.yaml), c_* collector (otel-collector.yaml).
PORT_NAMES = ("j_grpc", "j_http", "j_query", "j_query_grpc", "j_health", "j_tel",
              "c_grpc", "c_http", "c_prom", "c_tel")
#: What ``scripts/stack.py up --standard-ports`` uses: the docker-compose ports an app expects.
STANDARD_PORTS: Mapping[str, int] = {
    "c_grpc": 4317, "c_http": 4318, "c_prom": 8889, "c_tel": 8888,
    "j_query": 16686, "j_query_grpc": 16685, "j_health": 13133,
}


@dataclass
class OtelStack:
    """The collector (``collector/otel-collector.yaml``) in front of Jaeger (``collector/jaeger.yaml``)."""

    otlp_grpc_endpoint: str
    otlp_http_endpoint: str
    jaeger_query_url: str
    prometheus_url: str
    collector_telemetry_url: str
    jaeger_otlp_grpc_endpoint: str
    log_dir: Path
    processes: list[ManagedProcess]
    started_at: datetime

    @classmethod
    def start(cls, sampling: Mapping[str, str] = TEST_SAMPLING, log_dir: Path | None = None,
              jaeger_binary: Path | None = None, ports: Mapping[str, int] | None = None) -> OtelStack:
        """Start Jaeger, then the collector; *ports* (keys of :data:`PORT_NAMES`) default to free ones."""
        binary = jaeger_binary or build_jaeger()
        log_dir = log_dir or Path(tempfile.mkdtemp(prefix="llmtrace-stack-"))
        try:
            return cls._start(sampling, log_dir, binary, ports)
        except StackError as err:
            if ports or not _port_clash(err):
                raise
            return cls._start(sampling, log_dir, binary, ports)

    @classmethod
    def _start(cls, sampling: Mapping[str, str], log_dir: Path, jaeger_binary: Path,
               ports: Mapping[str, int] | None) -> OtelStack:
        binary = str(jaeger_binary)
        started_at = datetime.now(timezone.utc)
        chosen = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
        p = {**chosen, **(ports or {})}
        jaeger_env = {
            "LLMTRACE_JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{p['j_grpc']}",
            "LLMTRACE_JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{p['j_http']}",
            "LLMTRACE_JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{p['j_query']}",
            "LLMTRACE_JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{p['j_query_grpc']}",
            "LLMTRACE_JAEGER_HEALTH_ENDPOINT": f"127.0.0.1:{p['j_health']}",
            "LLMTRACE_JAEGER_TELEMETRY_HOST": "127.0.0.1",
            "LLMTRACE_JAEGER_TELEMETRY_PORT": str(p["j_tel"]),
        }
        collector_env = collector_env_for(sampling, p["c_grpc"], p["c_http"], p["c_prom"], p["c_tel"],
                                          f"127.0.0.1:{p['j_grpc']}")
        processes: list[ManagedProcess] = []
        try:
            processes.append(ManagedProcess(
                "jaeger", [binary, "--config", f"file:{JAEGER_CONFIG}"], jaeger_env,
                http_ok(f"http://127.0.0.1:{p['j_health']}/status"), log_dir))
            processes.append(ManagedProcess(
                "collector", [binary, "--config", f"file:{COLLECTOR_CONFIG}"], collector_env,
                otlp_http_accepts(f"127.0.0.1:{p['c_http']}"), log_dir))
            for proc in processes:
                proc.wait_healthy()
        except BaseException:
            for proc in processes:
                proc.stop()
            raise
        return cls(
            otlp_grpc_endpoint=f"http://127.0.0.1:{p['c_grpc']}",
            otlp_http_endpoint=f"http://127.0.0.1:{p['c_http']}",
            jaeger_query_url=f"http://127.0.0.1:{p['j_query']}",
            prometheus_url=f"http://127.0.0.1:{p['c_prom']}/metrics",
            collector_telemetry_url=f"http://127.0.0.1:{p['c_tel']}/metrics",
            jaeger_otlp_grpc_endpoint=f"http://127.0.0.1:{p['j_grpc']}",
            log_dir=log_dir, processes=processes, started_at=started_at,
        )

    def stop(self) -> None:
        for proc in reversed(self.processes):  # collector first: it flushes into Jaeger
            proc.stop()

    def __enter__(self) -> OtelStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log_path})\n{p.log_tail()}" for p in self.processes)

    def query_traces(self, service: str, span_name: str | None = None) -> list[StackSpan]:
        return query_traces(self.jaeger_query_url, service, span_name,
                            since=self.started_at - timedelta(minutes=5))

    def find_traces(self, service: str, span_name: str | None = None, timeout_s: float = 30.0,
                    min_traces: int = 1) -> list[StackSpan]:
        """Poll Jaeger until *min_traces* traces of *service* (containing *span_name*) are there.

        Returns every span of the matching traces. Raises :class:`AssertionError`
        with the stack's logs on timeout, so a failing test shows why.
        """
        deadline = time.monotonic() + timeout_s
        spans: list[StackSpan] = []
        while time.monotonic() < deadline:
            spans = self.query_traces(service, span_name)
            if len(by_trace(spans)) >= min_traces:
                return spans
            time.sleep(0.25)
        raise AssertionError(
            f"{len(by_trace(spans))} of {min_traces} traces of service {service!r}"
            f"{f' with span {span_name!r}' if span_name else ''} in Jaeger after {timeout_s}s\n{self.logs()}"
        )

    def prometheus_text(self) -> str:
        status, body = _http_get(self.prometheus_url)
        if status != 200:
            raise StackError(f"collector prometheus exporter answered {status}")
        return body.decode()


@contextlib.contextmanager
def running_stack(sampling: Mapping[str, str] = TEST_SAMPLING) -> Iterator[OtelStack]:
    stack = OtelStack.start(sampling)
    try:
        yield stack
    finally:
        stack.stop()


@dataclass
class GatewayStack:
    """Two-tier: a loadbalancing tier-1 collector in front of two sampling tier-2 collectors."""

    otlp_grpc_endpoint: str
    tier2_telemetry_urls: list[str]
    backend: OtelStack
    processes: list[ManagedProcess]

    @classmethod
    def start(cls, backend: OtelStack, sampling: Mapping[str, str] = TEST_SAMPLING) -> GatewayStack:
        jaeger = str(build_jaeger())
        gateway = str(build_gateway_collector())
        jaeger_otlp = backend.jaeger_otlp_grpc_endpoint.removeprefix("http://")
        processes: list[ManagedProcess] = []
        telemetry: list[str] = []
        tier2_endpoints: list[str] = []
        try:
            for index in range(2):
                p = dict(zip(("grpc", "http", "prom", "tel"), free_ports(4), strict=True))
                env = collector_env_for(sampling, p["grpc"], p["http"], p["prom"], p["tel"], jaeger_otlp)
                processes.append(ManagedProcess(
                    f"tier2-{index}", [jaeger, "--config", f"file:{COLLECTOR_CONFIG}"], env,
                    otlp_http_accepts(f"127.0.0.1:{p['http']}"), backend.log_dir))
                telemetry.append(f"http://127.0.0.1:{p['tel']}/metrics")
                tier2_endpoints.append(f"127.0.0.1:{p['grpc']}")
            # Tier 2 listens before tier 1 starts: a tier-1 connection refused at start-up sits
            # in gRPC's reconnect backoff, and the first batches would wait out retries.
            for proc in processes:
                proc.wait_healthy()
            g = dict(zip(("grpc", "http", "tel"), free_ports(3), strict=True))
            env = {
                "LLMTRACE_GATEWAY_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{g['grpc']}",
                "LLMTRACE_GATEWAY_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{g['http']}",
                "LLMTRACE_GATEWAY_TELEMETRY_HOST": "127.0.0.1",
                "LLMTRACE_GATEWAY_TELEMETRY_PORT": str(g["tel"]),
                "LLMTRACE_GATEWAY_TIER2_A": tier2_endpoints[0],
                "LLMTRACE_GATEWAY_TIER2_B": tier2_endpoints[1],
                "LLMTRACE_GATEWAY_QUEUE_DIR": str(backend.log_dir / "tier1-queue"),
            }
            processes.append(ManagedProcess("tier1", [gateway, "--config", f"file:{GATEWAY_CONFIG}"], env,
                                            otlp_http_accepts(f"127.0.0.1:{g['http']}"), backend.log_dir))
            processes[-1].wait_healthy()
        except BaseException:
            for proc in reversed(processes):
                proc.stop()
            raise
        return cls(otlp_grpc_endpoint=f"http://127.0.0.1:{g['grpc']}", tier2_telemetry_urls=telemetry,
                   backend=backend, processes=processes)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()

    def tier2_accepted_spans(self) -> list[float]:
        """``otelcol_receiver_accepted_spans`` of each tier-2 collector (its own telemetry)."""
        counts = []
        for url in self.tier2_telemetry_urls:
            total = 0.0
            for line in _http_get(url)[1].decode().splitlines():
                if line.startswith("otelcol_receiver_accepted_spans") and 'receiver="otlp"' in line:
                    total += float(line.rsplit(" ", 1)[1])
            counts.append(total)
        return counts
