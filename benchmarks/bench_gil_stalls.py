#!/usr/bin/env python3
"""Stalls of an engine loop while llmtrace's own threads build and export its spans.

An engine loop of pure Python (as a CPU-bound host loop is: the "forward" here is a few
hundred additions) runs for a fixed time with step tracing on; the span builder builds
each closed window and the file exporter encodes and writes the spans, on their own
threads. Whenever one of them holds the GIL, the loop waits — up to CPython's switch
interval (5 ms) each time — and a step takes longer. Reported: the distribution of the
loop's step wall times (p50 is the step itself; the tail is the stalls) and how many steps
it managed (at this rate the exporter cannot keep up and drops spans — counted — in both
trees alike). The cyclic garbage collector is off (``--gc`` turns it on), because its passes
over this loop's ever-growing request records would dominate the tail.

    python benchmarks/bench_gil_stalls.py [--seconds 6] [--batch 16] [--exporter file|none]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--exporter", choices=("file", "none"), default="file")
    parser.add_argument("--gc", action="store_true", help="leave the cyclic garbage collector on")
    args = parser.parse_args()
    if not args.gc:
        gc.disable()
    os.environ.setdefault("LLMTRACE_QUIET", "1")
    import llmtrace

    with tempfile.TemporaryDirectory() as tmp:
        exporter = f"file:{os.path.join(tmp, 'stalls.jsonl')}" if args.exporter == "file" else "none"
        llmtrace.instrument(exporter=exporter, gpu="off", metrics=False, engine_window_steps=256,
                            engine_window_s=3600)
        engine = llmtrace.EngineTracer("stalls")
        ids = [f"r{i}" for i in range(args.batch)]
        for rid in ids:
            engine.tracker.add(rid)
        steps: list[int] = []
        last = time.perf_counter_ns()
        stop = last + int(args.seconds * 1e9)
        while last < stop:
            step = engine.begin_step()
            step.batch(ids, decode_tokens=args.batch)
            with step.phase("forward"):
                x = 0
                for i in range(300):  # the "forward": CPU-bound Python holding the GIL
                    x += i
            step.tokens()
            engine.end_step(step)
            now = time.perf_counter_ns()
            steps.append(now - last)
            last = now
        llmtrace.shutdown(timeout_s=30)
    steps.sort()

    def q(p: float) -> float:
        return steps[int(p * (len(steps) - 1))] / 1e3

    print(f"{len(steps)} steps in {args.seconds:g} s (batch {args.batch}, exporter {args.exporter}); step wall time "
          f"µs: p50 {q(0.5):.0f}, p99 {q(0.99):.0f}, p99.9 {q(0.999):.0f}, max {steps[-1] / 1e3:.0f}")


if __name__ == "__main__":
    main()
