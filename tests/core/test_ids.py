"""Trace and span ids do not repeat when the host seeds ``random`` alike in several processes,
as an inference engine's data-parallel ranks do (``random.seed(seed)`` in every rank)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

from llmtrace._otel.ids import PrivateRandomIdGenerator, getrandbits

#: One "rank": instrument, seed `random` as an engine does, then three requests and a step window.
RANK = textwrap.dedent("""
    import random, sys
    import llmtrace
    llmtrace.instrument(exporter="file:" + sys.argv[1], service_name="rank", gpu="off")
    random.seed(1234)
    for i in range(3):
        llmtrace.start_request(f"r{i}").finished("stop")
    engine = llmtrace.EngineTracer("dp0")
    with engine.step() as step:
        step.batch([])
    engine.flush_window()
    llmtrace.shutdown(timeout_s=10)
""")


def _ids(path: Path) -> tuple[set[str], set[str]]:
    traces, spans = set(), set()
    for line in path.read_text().splitlines():
        for resource in json.loads(line).get("resourceSpans", []):
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    traces.add(span["traceId"])
                    spans.add(span["spanId"])
    return traces, spans


def test_two_processes_seeded_alike_make_different_ids(tmp_path: Path) -> None:
    """Two processes that call ``random.seed(1234)`` after instrument(): no trace or span id in
    common (the SDK's own generator, which draws from ``random``, gives both the same ids)."""
    outs = [tmp_path / f"rank{i}.jsonl" for i in range(2)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMTRACE_", "OTEL_"))}
    for out in outs:
        subprocess.run([sys.executable, "-c", RANK, str(out)], env=env, check=True, timeout=120)
    (traces_a, spans_a), (traces_b, spans_b) = _ids(outs[0]), _ids(outs[1])
    assert len(spans_a) >= 4 and len(spans_b) >= 4
    assert not traces_a & traces_b
    assert not spans_a & spans_b


def test_the_generator_ignores_random_seed_and_is_reseeded_in_a_forked_child() -> None:
    generator = PrivateRandomIdGenerator()
    random.seed(7)
    first = (generator.generate_trace_id(), generator.generate_span_id())
    random.seed(7)
    assert first != (generator.generate_trace_id(), generator.generate_span_id())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next draw, to the parent
        os.write(write, str(getrandbits(64)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = int(os.read(read, 64).decode())
    os.close(read)
    assert child != getrandbits(64)
