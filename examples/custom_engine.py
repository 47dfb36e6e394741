"""A custom continuous-batching engine traced with llmtrace's engine API, in a few lines.

The engine below is a toy (its "model" sleeps for a time proportional to the batch),
but the tracing calls are exactly what a real engine adds to its loop:

* ``engine.tracker.add(request_id, carrier=...)`` when a request reaches the engine;
* ``begin_step`` / ``step.phase(...)`` / ``step.batch(...)`` / ``step.tokens()`` /
  ``end_step`` around each scheduler iteration (``step.mark(name)`` at each phase boundary
  instead of ``with step.phase(name):`` blocks is cheaper, for the tightest loops);
* ``engine.tracker.finished(request_id, reason)`` when a request completes.

Run it: ``python examples/custom_engine.py`` — it writes ``custom-engine-traces.jsonl``;
then ``llmtrace analyze custom-engine-traces.jsonl``.
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import llmtrace


@dataclass
class Request:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    new: bool = True
    trace_headers: dict[str, str] = field(default_factory=dict)


class ToyEngine:
    def __init__(self, max_batch: int = 4) -> None:
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.max_batch = max_batch
        self.tracer = llmtrace.EngineTracer("toy0")  # one per scheduler / device group

    def add(self, request: Request) -> None:
        self.waiting.append(request)
        self.tracer.tracker.add(request.request_id, carrier=request.trace_headers or None,
                                prompt_tokens=request.prompt_tokens, max_tokens=request.max_tokens)

    def step(self) -> None:
        step = self.tracer.begin_step()
        with step.phase("schedule"):
            while self.waiting and len(self.running) < self.max_batch:
                self.running.append(self.waiting.popleft())
            prefill = sum(r.prompt_tokens for r in self.running if r.new)
        step.batch([r.request_id for r in self.running], prefill_tokens=prefill,
                   decode_tokens=sum(1 for r in self.running if not r.new),
                   waiting=len(self.waiting), running=len(self.running))
        with step.phase("forward"):
            time.sleep(0.002 + 0.0005 * len(self.running) + prefill * 1e-5)  # the "GPU"
        step.tokens()  # every request in the batch produced one token
        with step.phase("postprocess"):
            for request in list(self.running):
                request.new = False
                request.generated += 1
                if request.generated >= request.max_tokens:
                    self.running.remove(request)
                    self.tracer.tracker.finished(request.request_id, "length")
        self.tracer.end_step(step)


def main(path: str = "custom-engine-traces.jsonl", requests: int = 12) -> None:
    llmtrace.instrument(exporter=f"file:{path}", service_name="toy-engine")
    engine = ToyEngine()
    rng = random.Random(0)
    for i in range(requests):
        engine.add(Request(f"req-{i}", prompt_tokens=rng.randint(8, 64), max_tokens=rng.randint(4, 16)))
    while engine.running or engine.waiting:
        engine.step()
    llmtrace.shutdown()
    print(f"traces written to {path}; analyse with: llmtrace analyze {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
