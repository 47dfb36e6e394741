#!/usr/bin/env python3
"""Export-thread CPU per span: the SDK's OTLP protobuf encoding against llmtrace's OTLP/JSON
encoder (the ``file`` exporter and the ``http/json`` protocol), on the spans an engine emits.

The spans are a real engine timeline (``llm.step`` with its batch's links, ``llm.schedule``,
``llm.forward``) built by llmtrace's span builder; each encoder runs over the same list,
interleaved, best of ``--repeat`` (CPU time of this thread; on a shared machine only the
best is comparable).

The OTLP/JSON encoder runs twice: in Python and compiled (``native/src/otlp_json.rs``, the
default where llmtrace-native is built), on the same spans; their texts are compared first.

    python benchmarks/bench_otlp_encoding.py [--batch 16] [--steps 128] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any


def spans_of_an_engine(batch: int, steps: int) -> list[Any]:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import llmtrace
    from llmtrace import _runtime

    llmtrace.instrument(exporter="none", gpu="off", metrics=False, engine_window_steps=64, engine_window_s=3600)
    memory = InMemorySpanExporter()
    _runtime.tracer_provider().add_span_processor(SimpleSpanProcessor(memory))
    engine = llmtrace.EngineTracer("bench")
    ids = [f"r{i}" for i in range(batch)]
    for rid in ids:
        engine.tracker.add(rid)
    for _ in range(steps):
        step = engine.begin_step()
        step.mark("schedule")
        step.batch(ids, decode_tokens=batch)
        step.mark("forward")
        step.tokens()
        engine.end_step(step)
    engine.flush_window()
    llmtrace.flush()
    return list(memory.get_finished_spans())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as protobuf_messages

    from llmtrace._otel.otlp_json import COMPILED, encode_spans_python

    spans = spans_of_an_engine(args.batch, args.steps)
    encoders: dict[str, Callable[[Sequence[Any]], Any]] = {
        "SDK protobuf (grpc, http/protobuf)": lambda s: protobuf_messages(s).SerializeToString(),
        "llmtrace OTLP/JSON, Python": lambda s: encode_spans_python(s).encode(),
    }
    if COMPILED is not None:
        encoders["llmtrace OTLP/JSON, compiled (default)"] = lambda s: COMPILED.encode(s).encode()
    else:
        print("the compiled encoder is not in use (llmtrace-native not built, or LLMTRACE_OTLP_ENCODER=python)")
    if COMPILED is not None and COMPILED.encode(spans) != encode_spans_python(spans):
        raise SystemExit("the compiled and Python OTLP/JSON encoders disagree on these spans")
    best = dict.fromkeys(encoders, float("inf"))
    for _ in range(args.repeat):
        for name, encode in encoders.items():
            start = time.thread_time_ns()
            encode(spans)
            best[name] = min(best[name], (time.thread_time_ns() - start) / len(spans) / 1e3)
    print(f"{len(spans)} spans (engine, batch {args.batch}), best of {args.repeat}:")
    base = best["SDK protobuf (grpc, http/protobuf)"]
    for name, us in best.items():
        print(f"  {name:<40} {us:7.2f} µs per span  ({us / base:.2f}x)")


if __name__ == "__main__":
    main()
