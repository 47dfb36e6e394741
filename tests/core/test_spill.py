"""The spill: spans an OTLP endpoint refuses go to rotated OTLP-JSON-lines files and are re-sent.

The endpoint is a real OTLP/HTTP JSON receiver on loopback (``http.server`` in a thread), first
absent (connection refused), then listening; the exporter is llmtrace's own OTLP/HTTP JSON one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from llmtrace import semconv
from llmtrace._otel.export import BoundedSpanProcessor, ExportStats, OtlpHttpJsonSpanExporter
from llmtrace._otel.otlp_json import encode_spans
from llmtrace._otel.otlp_json_read import decode_spans
from llmtrace._otel.spill import SpillStore
from llmtrace._otel.spill_export import with_spill
from llmtrace.analysis.sources import load_spans
from llmtrace.config import resolve
from scripts.otel_stack.stack import free_port


class Receiver:
    """An OTLP/HTTP JSON endpoint that records the span ids it was sent."""

    def __init__(self, port: int) -> None:
        self.span_ids: list[str] = []
        received = self.span_ids

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for rs in body.get("resourceSpans", []):
                    for ss in rs["scopeSpans"]:
                        received.extend(span["spanId"] for span in ss["spans"])
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


def _pipeline(tmp_path: Path, port: int, **options: Any) -> tuple[TracerProvider, BoundedSpanProcessor, ExportStats]:
    settings = resolve({"spill_dir": str(tmp_path / "spill"), "service_name": "spill-test", **options}, environ={})
    stats = ExportStats()
    exporter = OtlpHttpJsonSpanExporter(f"http://127.0.0.1:{port}/v1/traces", timeout_s=0.3)
    spilling = with_spill(exporter, settings, stats)
    assert spilling is not None
    breaker, spiller = spilling
    processor = BoundedSpanProcessor(breaker, stats, settings.max_queue_size, "test", settings.max_queue_bytes,
                                     spiller)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider, processor, stats


def _emit(provider: TracerProvider, count: int) -> set[str]:
    tracer = provider.get_tracer("spill-test", "1.0")
    ids = set()
    for i in range(count):
        span = tracer.start_span(semconv.SPAN_REQUEST, attributes={"i": i, "text": "x" * 20})
        ids.add(format(span.get_span_context().span_id, "016x"))
        span.end()
    return ids


def _spilled_ids(directory: Path) -> set[str]:
    return {format(s.context.span_id, "016x") for path in sorted(directory.glob("*.jsonl"))
            for line in path.read_text().splitlines() for s in decode_spans(line)}


def _wait(condition: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_decoded_line_encodes_to_the_same_line() -> None:
    """Reading a spill line back gives spans the encoder turns into the identical line: every
    attribute type, events, links, kind, status and the resource and scope survive a re-send."""
    provider = TracerProvider()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("scope", "2.0")
    with tracer.start_as_current_span("parent", kind=SpanKind.SERVER) as parent:
        child = tracer.start_span("child", links=[Link(parent.get_span_context(), {"k": 1})], attributes={
            "s": "é\"\n", "i": -(2**63), "f": 0.1, "nan": float("nan"), "b": True,
            "strs": ["a", "b"], "ints": [1, 2], "floats": [1.5], "bools": [False]})
        child.add_event("evt", {"n": 3})
        child.set_status(Status(StatusCode.ERROR, "boom"))
        child.end()
    line = encode_spans(memory.get_finished_spans())
    assert line == encode_spans(decode_spans(line))


def test_spans_spill_while_the_endpoint_is_down_and_are_resent_when_it_is_back(tmp_path: Path, port: int) -> None:
    """Endpoint absent: every span lands in the spill, whose files the analyzer reads. Endpoint
    back: every span arrives exactly once, the spill empties, nothing is counted as dropped."""
    provider, processor, stats = _pipeline(tmp_path, port)
    sent = _emit(provider, 300)
    assert processor.force_flush(10_000)
    spill = tmp_path / "spill"
    _wait(lambda: stats.spilled == 300)
    assert sent == _spilled_ids(spill)
    assert 300 == len(load_spans(*map(str, sorted(spill.glob("*.jsonl")))).spans)
    receiver = Receiver(port)
    try:
        sent |= _emit(provider, 50)
        assert processor.force_flush(10_000)
        _wait(lambda: stats.exported >= 350)
        assert sorted(sent) == sorted(receiver.span_ids)
        assert (350, 0) == (stats.exported, stats.dropped)
        _wait(lambda: not list(spill.glob("*.jsonl")))
        assert [] == list(spill.glob("*.jsonl"))
    finally:
        processor.close(5000)
        receiver.close()


def test_a_full_queue_overflows_to_the_spill_without_blocking(tmp_path: Path, port: int) -> None:
    """With a 16-span queue and a dead endpoint, spans beyond the queue go to the overflow and on
    to disk; every span is exported, spilled or counted as dropped."""
    provider, processor, stats = _pipeline(tmp_path, port, max_queue_size=16)
    _emit(provider, 2000)
    processor.close(10_000)
    on_disk = len(_spilled_ids(tmp_path / "spill"))
    assert 2000 == on_disk + stats.dropped, (on_disk, stats.dropped_by_reason)
    assert on_disk == stats.spilled
    assert on_disk > 16


def test_the_spill_stays_within_its_byte_bound_and_counts_what_it_deletes(tmp_path: Path) -> None:
    """Writes past ``max_bytes`` delete the oldest segment; its spans are counted as spill_full."""
    stats = ExportStats()
    store = SpillStore(str(tmp_path), 256 * 1024, "svc", lambda n: stats.add(n, semconv.DROP_SPILL_FULL))
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    batch: list[ReadableSpan] = []
    for _ in range(50):
        span = tracer.start_span("s", attributes={"pad": "x" * 400})
        span.end()
        batch.append(span)  # type: ignore[arg-type]
    for _ in range(100):
        assert store.write(batch)
        assert sum(p.stat().st_size for p in tmp_path.glob("*.jsonl")) <= 256 * 1024
    kept = sum(len(decode_spans(line)) for p in tmp_path.glob("*.jsonl") for line in p.read_text().splitlines())
    assert 5000 == kept + stats.dropped_by_reason[semconv.DROP_SPILL_FULL]
    assert kept == store.spans_on_disk
    store.close()


def test_a_later_process_resends_what_a_dead_one_spilled(tmp_path: Path, port: int) -> None:
    """Segments whose writer is gone (its lock is free) are adopted and re-sent by the next process."""
    provider, processor, stats = _pipeline(tmp_path, port)
    sent = _emit(provider, 100)
    processor.close(5000)
    assert 100 == stats.spilled
    receiver = Receiver(port)
    try:
        _, processor2, stats2 = _pipeline(tmp_path, port)
        _wait(lambda: stats2.exported >= 100)
        assert sorted(sent) == sorted(receiver.span_ids)
        assert 100 == stats2.exported
        _wait(lambda: not list((tmp_path / "spill").glob("*")))
        assert [] == list((tmp_path / "spill").glob("*"))
        processor2.close(5000)
    finally:
        receiver.close()


def test_a_burst_past_the_queue_reaches_a_healthy_endpoint(tmp_path: Path, port: int) -> None:
    """A 400-span queue (so a 100-span overflow) and a burst of 500 spans with the endpoint up:
    whatever did not fit the queue went through the overflow and the spill, and still arrives."""
    receiver = Receiver(port)
    try:
        provider, processor, stats = _pipeline(tmp_path, port, max_queue_size=400)
        sent = _emit(provider, 500)
        assert processor.force_flush(10_000)
        _wait(lambda: stats.exported >= 500)
        assert (500, 0) == (stats.exported, stats.dropped)
        assert sorted(sent) == sorted(receiver.span_ids)
        processor.close(5000)
    finally:
        receiver.close()


def test_torn_and_malformed_lines_of_an_adopted_spill_are_skipped(tmp_path: Path, port: int) -> None:
    """A dead writer's segment with a torn last line and lines that are JSON but not OTLP: the
    well-formed lines are re-sent, the rest skipped, the directory emptied."""
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    spans = []
    for i in range(5):
        span = tracer.start_span("s", attributes={"i": i})
        span.end()
        spans.append(span)
    spill = tmp_path / "spill"
    spill.mkdir()
    (spill / "spill-dead-1-abcdef.lock").write_text("")
    good = encode_spans(spans)  # type: ignore[arg-type]
    lines = [good, '{"resourceSpans": 5}', '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 1}]}]}]}',
             good[: len(good) // 2]]
    (spill / "spill-dead-1-abcdef-000001.jsonl").write_text("\n".join(lines))
    receiver = Receiver(port)
    try:
        _, processor, stats = _pipeline(tmp_path, port)
        _wait(lambda: stats.exported >= 5)
        assert sorted(format(s.get_span_context().span_id, "016x") for s in spans) == sorted(receiver.span_ids)
        _wait(lambda: not list(spill.glob("*")))
        assert [] == list(spill.glob("*"))
        processor.close(5000)
    finally:
        receiver.close()


def test_the_queue_is_bounded_in_bytes_as_well_as_spans(port: int) -> None:
    """A 10,000-span queue bounded at 64 KiB (about 28 spans of 30 attributes, by the estimate):
    a burst of 300 such spans overflows on bytes long before the span bound; with no spill, what
    did not fit is dropped and counted as queue_full, and everything else reaches the endpoint."""
    receiver = Receiver(port)
    stats = ExportStats()
    exporter = OtlpHttpJsonSpanExporter(f"http://127.0.0.1:{port}/v1/traces", timeout_s=5)
    processor = BoundedSpanProcessor(exporter, stats, 10_000, "test", 64 * 1024)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    try:
        for i in range(300):
            tracer.start_span("s", attributes={f"a{k}": i for k in range(30)}).end()
        assert processor.force_flush(10_000)
        assert stats.dropped_by_reason.keys() == {semconv.DROP_QUEUE_FULL}
        assert 300 == stats.exported + stats.dropped
        assert stats.exported == len(receiver.span_ids)
    finally:
        processor.close(5000)
        receiver.close()
