#!/usr/bin/env python3
"""Analyzer throughput and memory on a generated span set (target: >= 200k spans/s, <= 1 KB/span).

    python benchmarks/bench_analyzer.py                  # 1M spans (generated once, cached)
    python benchmarks/bench_analyzer.py --spans 200000   # scaled down
    python benchmarks/bench_analyzer.py --json           # one JSON line for CI dashboards
    python benchmarks/bench_analyzer.py --repeat 3       # best of 3 (a shared, loaded machine)

The span set is the simulated server of ``llmtrace.analysis.synthetic`` written as OTLP
JSON lines (what the file exporter produces): request traces (SERVER, llm.request, four
phases) and engine windows (llm.engine, llm.step with batch links, schedule / forward /
sample / postprocess, gc). Throughput is CPU time of this process (``time.process_time``)
for parse + model build + every analyzer, i.e. one core. Memory is what ``tracemalloc``
sees held by the built model after the read, divided by the span count; it is measured in
a second pass because tracing allocations slows the run several-fold. With ``--repeat N``
each stage reports its fastest of N runs (CPU time on a shared machine only ever inflates).
The read is what ``llmtrace analyze`` does: with ``llmtrace-native`` installed, engine-side
spans stay in a compiled engine table (``--no-table``: every span a Python object; memory
then counts the table's own bytes too, which ``tracemalloc`` cannot see).
The parse path is the compiled decoder (``native/``, built by ``.ci/run`` when cargo is
present), else the generic Python reader; ``LLMTRACE_ANALYSIS_DECODER`` = ``native`` /
``generic`` picks one and ``LLMTRACE_ANALYSIS_NATIVE=0`` runs every Python kernel (the
result's ``decoder`` says which ran).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from llmtrace.analysis import analyze, build_traceset
from llmtrace.analysis.sources import load_spans
from llmtrace.analysis.synthetic import SimConfig, write_jsonl

#: Spans the simulation emits per simulated second at the default load (measured).
_SPANS_PER_SIM_S = 1030


def dataset(spans: int, directory: str) -> tuple[str, int]:
    duration = max(1.0, spans / _SPANS_PER_SIM_S)
    path = os.path.join(directory, f"llmtrace-bench-{int(duration)}s.jsonl")
    count_path = path + ".count"
    if not (os.path.exists(path) and os.path.exists(count_path)):
        n = write_jsonl(path, SimConfig(duration_s=duration, arrival_rate=20, seed=11))
        with open(count_path, "w") as fh:
            fh.write(str(n))
    with open(count_path) as fh:
        return path, int(fh.read())


def decode_floor(path: str) -> float:
    """CPU seconds to JSON-decode every line and nothing else: the floor no parser beats.

    Reported so a number from a loaded or slower machine can be read as a ratio."""
    from llmtrace.analysis.sources._json import loads

    return _cpu_over_lines(path, loads)


def _cpu_over_lines(path: str, decode: Callable[[bytes], object]) -> float:
    """CPU seconds for *decode* over every line of *path*, the collector paused as the analyzer does."""
    gc.disable()
    t0 = time.process_time()
    with open(path, "rb") as fh:
        for line in fh:
            decode(line)
    gc.enable()
    return time.process_time() - t0


def decoder_in_use(path: str) -> str:
    """Which OTLP line decoder ``load_spans`` uses here (native or generic; typed in trees
    that still had the msgspec decoder, for A/B runs)."""
    from llmtrace.analysis.sources.files import decoder_name

    return decoder_name(path)


def new_table(use: bool) -> object | None:
    """An engine table for the read (what ``llmtrace analyze`` uses), when asked for and
    this llmtrace has one (A/B runs against old trees: ``--no-table`` or an old tree)."""
    if not use:
        return None
    try:
        from llmtrace.analysis.sources import new_engine_table
    except ImportError:
        return None
    return new_engine_table()


# Old trees (A/B runs) have no table parameters: pass one only when there is a table.
def _load(path: str, table: object | None) -> Any:
    return load_spans(path) if table is None else load_spans(path, table=table)  # type: ignore[call-arg]


def _build(loaded: Any, table: object | None) -> Any:
    if table is None:
        return build_traceset(loaded.spans, warnings=loaded.warnings)
    return build_traceset(loaded.spans, warnings=loaded.warnings, table=table)  # type: ignore[call-arg]


def throughput(path: str, use_table: bool) -> dict[str, float]:
    gc.collect()
    t0 = time.process_time()
    table = new_table(use_table)
    loaded = _load(path, table)
    t1 = time.process_time()
    ts = _build(loaded, table)
    t2 = time.process_time()
    analyze(ts, source=path)
    t3 = time.process_time()
    n = ts.span_count
    return {
        "spans": n,
        "parse_s": t1 - t0,
        "build_s": t2 - t1,
        "analyze_s": t3 - t2,
        "spans_per_s": n / (t3 - t0),
        "parse_spans_per_s": n / (t1 - t0),
    }


def memory(path: str, use_table: bool) -> dict[str, float]:
    """Python objects held (tracemalloc) plus what the compiled engine table holds outside
    Python's allocator (its own count: tracemalloc cannot see it)."""
    gc.collect()
    tracemalloc.start()
    table = new_table(use_table)
    loaded = _load(path, table)
    ts = _build(loaded, table)
    del loaded
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    native_bytes = table.native.nbytes() if table is not None else 0  # type: ignore[attr-defined]
    n = ts.span_count
    return {
        "held_bytes": held + native_bytes,
        "native_bytes": native_bytes,
        "peak_bytes": peak + native_bytes,
        "bytes_per_span": (held + native_bytes) / n,
        "peak_bytes_per_span": (peak + native_bytes) / n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_000_000, help="approximate span count (default 1M)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the generated set is cached")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--no-memory", action="store_true", help="skip the (slow) tracemalloc pass")
    parser.add_argument("--repeat", type=int, default=1, help="runs; each stage reports its fastest (default 1)")
    parser.add_argument(
        "--no-table", action="store_true", help="every span a Python object (no compiled engine table), for A/B runs"
    )
    args = parser.parse_args()
    use_table = not args.no_table
    path, n = dataset(args.spans, args.dir)
    result: dict[str, float | str] = {"dataset": path, "file_bytes": os.path.getsize(path)}
    runs = [throughput(path, use_table) for _ in range(max(1, args.repeat))]
    best = {k: min(r[k] for r in runs) for k in ("parse_s", "build_s", "analyze_s")}
    total = best["parse_s"] + best["build_s"] + best["analyze_s"]
    best.update(spans=runs[0]["spans"], spans_per_s=runs[0]["spans"] / total)
    best["parse_spans_per_s"] = runs[0]["spans"] / best["parse_s"]
    result.update(best)
    result["runs"] = len(runs)
    result["decoder"] = decoder_in_use(path)
    result["engine_table"] = "yes" if new_table(use_table) is not None else "no"
    result["decode_floor_s"] = decode_floor(path)
    result["load_average_1m"] = os.getloadavg()[0]
    if not args.no_memory:
        result.update(memory(path, use_table))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"dataset        {path}: {n:,} spans, {result['file_bytes'] / 1e6:.0f} MB; best of {result['runs']} run(s)")
    print(
        f"parse          {result['parse_s']:.2f} s  ({result['parse_spans_per_s']:,.0f} spans/s, "
        f"{result['decoder']} decoder, compiled engine table: {result['engine_table']})"
    )
    print(f"build model    {result['build_s']:.2f} s")
    print(f"analyze        {result['analyze_s']:.2f} s")
    total = result["parse_s"] + result["build_s"] + result["analyze_s"]
    print(
        f"JSON decode    {result['decode_floor_s']:.2f} s alone (the floor); parse+build+analyze = "
        f"{total / result['decode_floor_s']:.1f}x that; load average {result['load_average_1m']:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    ok = "ok" if result["spans_per_s"] >= 200_000 else "BELOW TARGET"
    print(f"throughput     {result['spans_per_s']:,.0f} spans/s on one core (target >= 200,000: {ok})")
    if "bytes_per_span" in result:
        ok = "ok" if result["bytes_per_span"] <= 1024 else "ABOVE TARGET"
        print(
            f"memory held    {result['bytes_per_span']:.0f} B/span (target <= 1024: {ok}); "
            f"peak while parsing {result['peak_bytes_per_span']:.0f} B/span"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
