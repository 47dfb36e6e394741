"""An instrumented process that forks, for tests/chaos/test_fork.py.

``python -m tests.chaos.fork_app GO_FILE``: exports OTLP/gRPC to LLMTRACE_ENDPOINT (down at
first), spills to LLMTRACE_SPILL_DIR. Emits 200 spans, forks a child that emits 100 spans of
its own and exits while the endpoint is still down, then waits for GO_FILE (the test creates it
once the collector listens), emits 100 more, waits until everything it and its child spilled is
re-sent, and prints one JSON line: the span ids it and its child made, and its counters.
"""

from __future__ import annotations

import json
import os
import sys
import time

from opentelemetry import trace

import llmtrace


def emit(count: int, tag: str) -> list[str]:
    tracer = trace.get_tracer("tests.chaos.fork_app")
    ids = []
    for i in range(count):
        with tracer.start_as_current_span("llm.request", attributes={"phase": tag, "i": i}) as span:
            ids.append(format(span.get_span_context().span_id, "016x"))
    return ids


def main() -> None:
    go_file, child_file = sys.argv[1], sys.argv[1] + ".child"
    handle = llmtrace.instrument(gpu="off", metrics=False)
    parent_ids = emit(200, "before-fork")
    handle.providers.tracer_provider.force_flush(10_000)
    pid = os.fork()
    if pid == 0:
        child = llmtrace.instrument(gpu="off", metrics=False)
        ids = emit(100, "child")
        llmtrace.shutdown(timeout_s=10)
        with open(child_file, "w") as out:
            json.dump({"ids": ids, "pid": os.getpid(), "spilled": child.providers.drops.spilled,
                       "dropped": child.providers.drops.dropped}, out)
        os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 120
    while not os.path.exists(go_file) and time.monotonic() < deadline:
        time.sleep(0.1)
    parent_ids += emit(100, "after-fork")
    stats = handle.providers.drops
    with open(child_file) as result:
        child_result = json.load(result)
    expected = len(parent_ids) + child_result["spilled"]
    deadline = time.monotonic() + 60
    while stats.exported < expected and time.monotonic() < deadline:
        handle.providers.tracer_provider.force_flush(5_000)
        time.sleep(0.2)
    exported, spilled, dropped = stats.exported, stats.spilled, stats.dropped
    llmtrace.shutdown(timeout_s=10)
    print(json.dumps({"parent_ids": parent_ids, "child": child_result, "exported": exported,
                      "spilled": spilled, "dropped": dropped, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
