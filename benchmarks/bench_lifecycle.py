"""Hot-path cost of the request lifecycle API (budgets: <= 2 µs per event, <= 0.5 µs per token),
against plain OpenTelemetry manual spans doing the same job.

* per event: ``queued``/``scheduled``/``preempted``/``tokenized`` on a live handle;
* per token: ``handle.token()``, against ``span.add_event("token")`` (the manual way
  to keep per-token times) on a recording span;
* per request, on the calling thread: ``start_request`` -> tokenized -> queued ->
  scheduled -> N tokens -> finished, against a manual ``llm.request`` span with
  tokenize/queue/prefill/decode children and one event per token. llmtrace's
  span building runs on its builder thread: its cost per request is reported apart.

Both use the same SDK TracerProvider (no exporter, so export costs nothing to either).

    python benchmarks/bench_lifecycle.py [--requests 2000] [--tokens 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable


def _best_ns(fn: Callable[[], int], repeat: int, clock: Callable[[], int] = time.perf_counter_ns) -> float:
    """Median over *repeat* runs of (elapsed ns / operations); the span builder is drained between runs."""
    import llmtrace

    results = []
    for _ in range(repeat):
        llmtrace.flush(60)
        start = clock()
        ops = fn()
        results.append((clock() - start) / ops)
    return statistics.median(results)


def bench_events(n: int) -> int:
    import llmtrace

    handle = llmtrace.start_request("bench-events")
    for _ in range(n):
        handle.queued()
        handle.scheduled()
        handle.preempted()
        handle.tokenized(8)
    for times in (handle.tokenize, handle.queued_ns, handle.scheduled_ns):
        times.clear()  # do not make the builder thread build 3n phase spans during the next run
    handle.aborted(reason="abort")
    return 4 * n


def bench_tokens(n: int) -> int:
    import llmtrace

    handle = llmtrace.start_request("bench-tokens")
    token = handle.token
    for _ in range(n):
        token()
    handle.token_ns.clear()
    handle.aborted(reason="abort")
    return n


def bench_otel_events(n: int) -> int:
    from opentelemetry import trace

    span = trace.get_tracer("manual").start_span("llm.request")
    add_event = span.add_event
    for _ in range(n):
        add_event("token")
    span.end()
    return n


def bench_llmtrace_requests(requests: int, tokens: int) -> int:
    import llmtrace

    for i in range(requests):
        handle = llmtrace.start_request(str(i), model="bench", max_tokens=tokens)
        handle.tokenized(16)
        handle.queued()
        handle.scheduled()
        for _ in range(tokens):
            handle.token()
        handle.finished("length")
    return requests


def bench_otel_requests(requests: int, tokens: int) -> int:
    from opentelemetry import trace

    tracer = trace.get_tracer("manual")
    for i in range(requests):
        request = tracer.start_span("llm.request", attributes={"llm.request.id": str(i),
                                                                "gen_ai.request.model": "bench"})
        ctx = trace.set_span_in_context(request)
        tracer.start_span("llm.tokenize", context=ctx).end()
        tracer.start_span("llm.queue", context=ctx).end()
        prefill = tracer.start_span("llm.prefill", context=ctx)
        prefill.end()
        decode = tracer.start_span("llm.decode", context=ctx)
        for _ in range(tokens):
            decode.add_event("token")
        decode.end()
        request.set_attribute("gen_ai.usage.output_tokens", tokens)
        request.end()
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import llmtrace
    from llmtrace.lifecycle.builder import BUILDER

    llmtrace.instrument(exporter="none", gpu="off", metrics=False)
    results: dict[str, float] = {}
    results["event_us"] = _best_ns(lambda: bench_events(args.events), args.repeat) / 1e3
    results["token_us"] = _best_ns(lambda: bench_tokens(args.events), args.repeat) / 1e3
    results["otel_add_event_us"] = _best_ns(lambda: bench_otel_events(args.events), args.repeat) / 1e3
    llmtrace.flush()

    # Per request, CPU time of the calling thread only (the builder thread's work and the
    # GIL waits it causes are reported in the total below).
    results["request_hot_path_us"] = _best_ns(lambda: bench_llmtrace_requests(args.requests, args.tokens),
                                              args.repeat, time.thread_time_ns) / 1e3
    BUILDER.flush(60)
    cpu0 = time.process_time()
    bench_llmtrace_requests(args.requests, args.tokens)
    llmtrace.flush(60)
    results["request_total_cpu_us"] = (time.process_time() - cpu0) / args.requests * 1e6
    results["otel_manual_request_us"] = _best_ns(lambda: bench_otel_requests(args.requests, args.tokens),
                                                 args.repeat, time.thread_time_ns) / 1e3
    results["tokens_per_request"] = args.tokens
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))
    llmtrace.shutdown()


if __name__ == "__main__":
    main()
