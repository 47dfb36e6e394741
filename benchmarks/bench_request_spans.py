"""llmtrace's own threads' CPU per sampled request: the span builder and the file exporter.

A request goes through the lifecycle API as a serving handler drives it — opened under the
call's SERVER span context, tokenized, queued, scheduled, N streamed tokens, finished — and
the CPU time of llmtrace's threads (``llmtrace.overhead_cpu_s()``: the span builder's thread
and the exporter's, both measured by those threads themselves) is divided by the number of
requests. The exporter writes OTLP/JSON lines to a temporary file, as the default file
exporter does; serving metrics are on, as in production.

    python benchmarks/bench_request_spans.py [--requests 2000] [--tokens 16] [--repeat 5]

Each repeat is one batch of requests, flushed; the median and the spread are printed (this
is a shared VM). Run two trees' sources alternately (``PYTHONPATH=tree/src``) to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile


def one_batch(requests: int, tokens: int) -> tuple[float, float]:
    """(builder µs, exporter µs) per request for one batch of *requests*."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanContext, TraceFlags

    import llmtrace

    before = llmtrace.overhead_cpu_s()
    for i in range(requests):
        # The call's SERVER span: a sampled context with ids of its own, as the ASGI layer makes it.
        server = trace.NonRecordingSpan(SpanContext(0x1234 + i, 0x99 + i, False, TraceFlags(TraceFlags.SAMPLED)))
        token = otel_context.attach(trace.set_span_in_context(server))
        try:
            handle = llmtrace.start_request(f"r{i}", model="bench", max_tokens=tokens, stream=True)
            handle.tokenized(24)
            handle.queued()
            handle.scheduled(step_id=i)
            for _ in range(tokens):
                handle.token()
            handle.finished("length")
        finally:
            otel_context.detach(token)
    llmtrace.flush(60)
    after = llmtrace.overhead_cpu_s()
    return ((after["span_builder"] - before["span_builder"]) / requests * 1e6,
            (after["exporter"] - before["exporter"]) / requests * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import llmtrace

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LLMTRACE_QUIET"] = "1"
        llmtrace.instrument(exporter=f"file:{os.path.join(tmp, 'spans.jsonl')}", gpu="off")
        one_batch(200, args.tokens)  # warm-up: imports, first-call caches
        runs = [one_batch(args.requests, args.tokens) for _ in range(args.repeat)]
        llmtrace.shutdown()
    builder = [b for b, _ in runs]
    exporter = [e for _, e in runs]
    print(json.dumps({"builder_us": round(statistics.median(builder), 1),
                      "builder_spread_us": [round(min(builder), 1), round(max(builder), 1)],
                      "exporter_us": round(statistics.median(exporter), 1),
                      "exporter_spread_us": [round(min(exporter), 1), round(max(exporter), 1)],
                      "tokens": args.tokens}))


if __name__ == "__main__":
    main()
