"""Engine-thread cost of step tracing, per step (budget: <= 20 µs).

A loop doing the llmtrace calls an engine makes each step — begin_step, four
phases, the batch of N requests, one token each, end_step — against the same
loop without them, in thread CPU time. The span builder's work (on its own
thread, when the window closes) is reported separately.

    python benchmarks/bench_engine_step.py [--steps 20000] [--batch 16]
"""

from __future__ import annotations

import argparse
import time


def run(steps: int, batch: int, traced: bool) -> tuple[float, float]:
    import llmtrace
    from llmtrace.lifecycle.builder import BUILDER

    engine = llmtrace.EngineTracer("bench") if traced else None
    ids = [f"r{i}" for i in range(batch)]
    if engine is not None:
        for rid in ids:
            engine.tracker.add(rid)
    sink = 0
    cpu_start = time.thread_time()
    start = time.perf_counter()
    for _ in range(steps):
        if engine is None:
            sink += len(ids)
            continue
        step = engine.begin_step()
        with step.phase("schedule"):
            sink += 1
        step.batch(ids, decode_tokens=batch, waiting=0, running=batch, kv_cache_usage=0.5)
        with step.phase("forward"):
            sink += 1
        with step.phase("sample"):
            sink += 1
        step.tokens()
        with step.phase("postprocess"):
            sink += 1
        engine.end_step(step)
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu_start
    if engine is not None:
        built = time.perf_counter()
        engine.flush_window()
        BUILDER.flush(600)
        builder_us = (time.perf_counter() - built) / steps * 1e6
        print(f"  span builder (its own thread, off the engine's path): {builder_us:.0f} µs per step "
              f"to build the step's spans ({4 + 1} spans and {batch} links)")
    return elapsed / steps * 1e6, cpu / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    import llmtrace

    # One window holds every step: the timed loop measures the engine thread alone; the span
    # builder's work (on its own thread) is timed separately when the window is flushed.
    llmtrace.instrument(exporter="none", metrics=False, gpu="off", engine_window_steps=args.steps + 1,
                        engine_window_s=3600)
    bare_wall, bare_cpu = run(args.steps, args.batch, traced=False)
    wall, cpu = run(args.steps, args.batch, traced=True)
    print(f"engine thread, batch {args.batch}: {cpu - bare_cpu:.2f} µs CPU per step for tracing "
          f"(budget 20 µs; wall {wall - bare_wall:.2f} µs)")


if __name__ == "__main__":
    main()
