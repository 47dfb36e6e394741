"""Hand-built spans for analyzer tests: times in milliseconds from an arbitrary epoch."""

from __future__ import annotations

import itertools
import random
from typing import Any

from llmtrace import semconv as sc
from llmtrace.analysis.model import Link, Span, SpanKind, StatusCode

T0 = 1_700_000_000_000_000_000
_ids = itertools.count(1)


def ms(x: float) -> int:
    return T0 + round(x * 1_000_000)


def sid() -> str:
    return f"{next(_ids):016x}"


def span(
    name: str,
    start_ms: float,
    end_ms: float,
    *,
    parent: Span | None = None,
    trace: str = "t" * 32,
    span_id: str | None = None,
    parent_id: str | None = None,
    attrs: dict[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    service: str = "svc",
    links: tuple[Link, ...] = (),
    resource: dict[str, Any] | None = None,
) -> Span:
    return Span(
        trace_id=parent.trace_id if parent is not None else trace,
        span_id=span_id or sid(),
        parent_id=parent.span_id if parent is not None else parent_id,
        name=name,
        start_ns=ms(start_ms),
        end_ns=ms(end_ms),
        kind=kind,
        status=StatusCode.UNSET,
        attributes=attrs or {},
        links=links,
        service=service,
        resource=resource or {},
    )


def request_trace(
    trace: str,
    start: float,
    tokenize: float,
    queue: float,
    prefill: float,
    decode: float,
    *,
    input_tokens: int = 100,
    server_pad: float = 0.0,
    attrs: dict[str, Any] | None = None,
) -> list[Span]:
    """A request with sequential phases of the given lengths (ms), optionally inside a SERVER span."""
    t = start
    end = start + tokenize + queue + prefill + decode
    out: list[Span] = []
    server = None
    if server_pad:
        server = span(
            "POST /v1/completions", start - server_pad, end + server_pad, trace=trace, kind=SpanKind.SERVER
        )
        out.append(server)
    a = {
        sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 10,
        sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: (tokenize + queue + prefill) / 1e3,
        sc.LLM_REQUEST_ID: f"req-{trace[:6]}",
        **(attrs or {}),
    }
    req = span(sc.SPAN_REQUEST, start, end, parent=server, trace=trace, attrs=a)
    out.append(req)
    for name, d in (
        (sc.SPAN_TOKENIZE, tokenize),
        (sc.SPAN_QUEUE, queue),
        (sc.SPAN_PREFILL, prefill),
        (sc.SPAN_DECODE, decode),
    ):
        if d:
            out.append(span(name, t, t + d, parent=req))
        t += d
    return out


def engine_window(
    engine: str,
    steps: list[tuple[float, float, float, float]],
    *,
    first_step_id: int = 0,
    trace: str | None = None,
    step_attrs: dict[str, Any] | None = None,
    per_step_attrs: list[dict[str, Any]] | None = None,
    gc: list[tuple[float, float]] | None = None,
) -> list[Span]:
    """One ``llm.engine`` window. Each step is (start, schedule_end, forward_end, postprocess_end) in ms;
    ``step_attrs`` go on every step, ``per_step_attrs[i]`` on step i."""
    trace = trace or f"{next(_ids):032x}"
    root = span(sc.SPAN_ENGINE, steps[0][0], steps[-1][3], trace=trace, attrs={sc.LLM_ENGINE_ID: engine})
    out = [root]
    for i, (a, b, c, d) in enumerate(steps):
        st = span(
            sc.SPAN_STEP,
            a,
            d,
            parent=root,
            attrs={
                sc.LLM_ENGINE_ID: engine,
                sc.LLM_STEP_ID: first_step_id + i,
                sc.LLM_BATCH_SIZE: 1,
                sc.LLM_QUEUE_WAITING: 0,
                sc.LLM_QUEUE_RUNNING: 1,
                **(step_attrs or {}),
                **(per_step_attrs[i] if per_step_attrs else {}),
            },
        )
        out += [
            st,
            span(sc.SPAN_SCHEDULE, a, b, parent=st),
            span(sc.SPAN_FORWARD, b, c, parent=st, attrs={sc.LLM_ENGINE_ID: engine}),
            span(sc.SPAN_POSTPROCESS, c, d, parent=st),
        ]
    for a, b in gc or ():
        out.append(span(sc.SPAN_GC, a, b, parent=root))
    return out


def random_engine(rng: random.Random) -> list[Span]:
    """Steps with jittered, sometimes overlapping or out-of-order children, gc pauses inside
    and across host spans, tokenize spans and requests: every branch of the sweeps."""
    steps = []
    t = 0.0
    for _ in range(rng.randint(1, 40)):
        a = t + rng.choice([0.0, 0.0, rng.uniform(0, 5)])
        b = a + rng.uniform(0, 2)
        c = b + rng.choice([0.0, rng.uniform(0, 9)])
        d = c + rng.uniform(0, 2)
        if rng.random() < 0.1:  # a child that overlaps its neighbour: the full sweep
            b, c = c, b
        steps.append((a, min(b, c), max(b, c), d))
        t = d + rng.choice([-0.5, 0.0, rng.uniform(0, 4)]) if rng.random() < 0.9 else d
    end = steps[-1][3]
    gc = [(x, x + rng.uniform(0, 3)) for x in sorted(rng.uniform(0, end) for _ in range(rng.randint(0, 4)))]
    attrs = [{sc.LLM_QUEUE_WAITING: rng.choice([0, 0, 2]), sc.LLM_BATCH_SIZE: rng.choice([0, 1, 3])} for _ in steps]
    spans = engine_window("dp0", steps, gc=gc, per_step_attrs=attrs)
    for _ in range(rng.randint(0, 3)):
        x = rng.uniform(-2, end)
        spans.append(span(sc.SPAN_TOKENIZE, x, x + rng.uniform(0, 5), trace=f"{rng.getrandbits(128):032x}"))
    for _ in range(rng.randint(0, 3)):
        x = rng.uniform(0, end)
        spans += request_trace(f"{rng.getrandbits(128):032x}", x, 0, rng.uniform(0, 3), rng.uniform(0, 9), 1.0)
    return spans
