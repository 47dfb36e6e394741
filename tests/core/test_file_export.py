"""The embedded default exporter: OTLP/JSON lines that several processes can append to."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from llmtrace.analysis.sources import load_spans

_EMIT = """
import sys, llmtrace
from opentelemetry import trace
llmtrace.instrument(service_name=sys.argv[2], metrics=False, gpu="off")
tracer = trace.get_tracer("t")
for i in range(200):
    with tracer.start_as_current_span("llm.request") as span:
        span.set_attribute("i", i)
        with tracer.start_as_current_span("llm.tokenize"):
            pass
llmtrace.shutdown()
"""


def _emit(path: Path, service: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LLMTRACE_FILE_PATH": str(path)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return subprocess.Popen([sys.executable, "-c", _EMIT, str(path), service], env=env, text=True,
                            stderr=subprocess.PIPE)


def test_two_processes_append_whole_lines_in_otlp_json(tmp_path: Path) -> None:
    """With no endpoint, spans go to the file; concurrent writers never interleave a line;
    ids are hex as OTLP/JSON requires; the file path is announced once on stderr."""
    path = tmp_path / "traces.jsonl"
    procs = [_emit(path, "svc-a"), _emit(path, "svc-b")]
    stderr = [p.communicate(timeout=120)[1] for p in procs]
    assert [0, 0] == [p.returncode for p in procs]
    assert all(1 == err.count(f"writing traces and metrics to {path}") for err in stderr)
    count = 0
    for line in path.read_text().splitlines():
        document = json.loads(line)
        for rs in document["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    assert re.fullmatch(r"[0-9a-f]{32}", span["traceId"])
                    assert re.fullmatch(r"[0-9a-f]{16}", span["spanId"])
                    count += 1
    assert 800 == count
    services = {s.service for s in load_spans(str(path)).spans}
    assert {"svc-a", "svc-b"} == services



def test_the_export_threads_cpu_time_is_counted(tmp_path: Path) -> None:
    """The bounded processor's exporter adds its own thread CPU time to ExportStats."""
    from opentelemetry.sdk.trace import TracerProvider

    from llmtrace._otel.export import BoundedSpanProcessor, ExportStats, JsonLinesSpanExporter, open_sink

    stats = ExportStats()
    processor = BoundedSpanProcessor(JsonLinesSpanExporter(open_sink(str(tmp_path / "t.jsonl"))), stats, 1000, "t")
    provider = TracerProvider()
    provider.add_span_processor(processor)
    for _ in range(200):
        provider.get_tracer("t").start_span("s", attributes={"k": "v" * 50}).end()
    assert processor.force_flush(10_000)
    assert 0 < stats.cpu_s and 0 == stats.dropped
    provider.shutdown()


def test_the_export_interval_is_how_long_a_span_waits_in_the_queue(tmp_path: Path) -> None:
    """``span_export_interval_s``: with 0.05 s a lone span reaches the file without a flush; with an
    hour it waits in the queue (a flush still sends it)."""
    import time

    from opentelemetry.sdk.trace import TracerProvider

    from llmtrace._otel.export import BoundedSpanProcessor, ExportStats, JsonLinesSpanExporter, open_sink

    written = {}
    for interval in (0.05, 3600.0):
        path = tmp_path / f"{interval}.jsonl"
        processor = BoundedSpanProcessor(JsonLinesSpanExporter(open_sink(str(path))), ExportStats(), 1000, "t",
                                         interval_s=interval)
        provider = TracerProvider()
        provider.add_span_processor(processor)
        provider.get_tracer("t").start_span("s").end()
        deadline = time.monotonic() + (5.0 if interval < 1 else 1.0)
        while time.monotonic() < deadline and not (path.exists() and path.read_text()):
            time.sleep(0.02)
        written[interval] = bool(path.exists() and path.read_text())
        assert processor.force_flush(10_000) and path.read_text().count("\n") == 1
        provider.shutdown()
    assert {0.05: True, 3600.0: False} == written


def test_spans_handed_over_together_keep_their_order_bounds_and_sampling(tmp_path: Path) -> None:
    """on_end_many (the span builder's call) fills the SDK batch queue directly: the spans reach the
    exporter in the order given, unsampled ones are left out, and a full queue drops and counts the
    rest exactly as on_end one by one does."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.trace import SpanContext, TraceFlags

    from llmtrace._otel.export import BoundedSpanProcessor, ExportStats, JsonLinesSpanExporter, open_sink
    from llmtrace.analysis.sources import load_spans

    out = tmp_path / "t.jsonl"
    stats = ExportStats()
    processor = BoundedSpanProcessor(JsonLinesSpanExporter(open_sink(str(out))), stats, 4, "t")
    assert processor._sdk_queue is not None, "the SDK's batch processor no longer has the shape filled directly"
    tracer = TracerProvider().get_tracer("t")
    spans: list[ReadableSpan] = []
    for i in range(6):
        span = tracer.start_span(f"s{i}")
        span.end()
        assert isinstance(span, ReadableSpan)
        spans.append(span)
    unsampled = ReadableSpan("never", SpanContext(5, 7, False, TraceFlags(0)), start_time=1, end_time=2)
    processor.on_end_many([spans[0], unsampled, *spans[1:]])
    assert processor.force_flush(10_000)
    assert ["s0", "s1", "s2", "s3"] == [span.name for span in load_spans(str(out)).spans]
    assert 2 == stats.dropped
    processor.shutdown()
    processor.on_end_many(spans)  # after shutdown: the SDK's own path, which ignores them
    assert ["s0", "s1", "s2", "s3"] == [span.name for span in load_spans(str(out)).spans]
