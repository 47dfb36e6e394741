"""A deterministic simulated inference server that writes llmtrace-shaped OTLP JSON.

Used by the benchmark (a million spans without a GPU), by the HTML report test and by
documentation examples. The simulation is a continuous-batching loop: Poisson arrivals,
a waiting queue, one prefill per request then one decode token per step, a maximum batch
size, and a garbage-collector pause now and then; the engine sleeps when nothing is in
flight, which is exactly the "idle, nothing to do" the analyzer must tell apart from host
overhead. It is a fixture generator, not a model of any particular engine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from llmtrace import semconv as sc

_MS = 1_000_000
_T0 = 1_767_000_000 * 1_000_000_000  # a fixed epoch so outputs are reproducible


@dataclass
class SimConfig:
    duration_s: float = 10.0
    arrival_rate: float = 20.0  # requests/s
    max_batch: int = 16
    seed: int = 7
    window_steps: int = 64
    gc_every_steps: int = 400
    gc_ms: float = 6.0
    schedule_ms: float = 0.25
    postprocess_ms: float = 0.4
    sample_ms: float = 0.1
    service: str = "llmtrace-sim"
    engine_id: str = "dp0"
    t0_ns: int = _T0  # fixed by default so outputs are reproducible; tests that ship to Jaeger use "now"


@dataclass
class _Req:
    rid: int
    arrival: int
    input_tokens: int
    output_tokens: int
    trace_id: str
    span_ids: dict[str, str] = field(default_factory=dict)
    queued: int = 0
    first_sched: int = 0
    first_token: int = 0
    done_tokens: int = 0
    end: int = 0
    first_step: int = 0
    last_step: int = 0


def _attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for k, v in d.items():
        if isinstance(v, bool):
            val: dict[str, Any] = {"boolValue": v}
        elif isinstance(v, int):
            val = {"intValue": str(v)}
        elif isinstance(v, float):
            val = {"doubleValue": v}
        else:
            val = {"stringValue": str(v)}
        out.append({"key": k, "value": val})
    return out


class _Ids:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def trace(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def span(self) -> str:
        return f"{self.rng.getrandbits(64):016x}"


def _span(
    trace_id: str,
    span_id: str,
    parent: str | None,
    name: str,
    start: int,
    end: int,
    attrs: dict[str, Any] | None = None,
    kind: int = 1,
    links: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    sp: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
    }
    if parent:
        sp["parentSpanId"] = parent
    if attrs:
        sp["attributes"] = _attrs(attrs)
    if links:
        sp["links"] = [{"traceId": t, "spanId": s} for t, s in links]
    return sp


def _doc(service: str, spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs({"service.name": service})},
                "scopeSpans": [{"scope": {"name": "llmtrace"}, "spans": spans}],
            }
        ]
    }


def _arrivals(cfg: SimConfig, rng: random.Random, ids: _Ids) -> list[_Req]:
    """Poisson arrivals with log-normal prompt and completion lengths."""
    end_t = cfg.t0_ns + int(cfg.duration_s * 1e9)
    out: list[_Req] = []
    t = cfg.t0_ns
    while True:
        t += int(rng.expovariate(cfg.arrival_rate) * 1e9)
        if t >= end_t:
            return out
        inp = max(8, int(rng.lognormvariate(5.5, 0.8)))
        n_out = max(4, int(rng.lognormvariate(4.0, 0.6)))
        out.append(_Req(len(out), t, inp, n_out, ids.trace()))


class _Engine:
    """The continuous-batching loop; spans of the current window accumulate in ``window``."""

    def __init__(self, cfg: SimConfig, ids: _Ids) -> None:
        self.cfg, self.ids = cfg, ids
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.now = cfg.t0_ns
        self.step_id = 0
        self.steps_in_window = 0
        self.window: list[dict[str, Any]] = []
        self.win_trace, self.win_span, self.win_start = ids.trace(), ids.span(), self.now

    def close_window(self) -> Iterator[dict[str, Any]]:
        if self.window:
            yield _window_doc(
                self.cfg, self.window, self.win_trace, self.win_span, self.win_start, self.now, self.step_id
            )
        self.window, self.steps_in_window = [], 0
        self.win_trace, self.win_span, self.win_start = self.ids.trace(), self.ids.span(), self.now

    def step(self, ready: list[_Req]) -> list[_Req]:
        """Run one iteration from ``self.now``; return the requests that finished in it."""
        cfg, ids, now = self.cfg, self.ids, self.now
        sched_end = now + int(cfg.schedule_ms * _MS * (1 + 0.05 * len(self.running)))
        new = ready[: max(0, cfg.max_batch - len(self.running))]
        for r in new:
            self.waiting.remove(r)
            r.first_sched, r.first_step = now, self.step_id
        prefill_tokens = sum(r.input_tokens for r in new)
        decode = list(self.running)
        fwd_end = sched_end + int((3.0 + 0.01 * prefill_tokens + 0.15 * len(decode)) * _MS)
        samp_end = fwd_end + int(cfg.sample_ms * _MS)
        post_end = samp_end + int(cfg.postprocess_ms * _MS * (1 + 0.1 * (len(new) + len(decode))))
        batch = new + decode
        step_span = ids.span()
        links = [(r.trace_id, r.span_ids.setdefault("request", ids.span())) for r in batch]
        attrs = {
            sc.LLM_ENGINE_ID: cfg.engine_id,
            sc.LLM_STEP_ID: self.step_id,
            sc.LLM_BATCH_SIZE: len(batch),
            sc.LLM_BATCH_PREFILL_TOKENS: prefill_tokens,
            sc.LLM_BATCH_DECODE_TOKENS: len(decode),
            sc.LLM_QUEUE_WAITING: len(self.waiting),
            sc.LLM_QUEUE_RUNNING: len(batch),
            sc.LLM_KV_CACHE_USAGE: round(min(1.0, len(batch) / cfg.max_batch * 0.9), 3),
            sc.LLM_PREEMPTED: 0,
        }
        self.window.append(
            _span(self.win_trace, step_span, self.win_span, sc.SPAN_STEP, now, post_end, attrs, links=links)
        )
        for name, a, b in (
            (sc.SPAN_SCHEDULE, now, sched_end),
            (sc.SPAN_FORWARD, sched_end, fwd_end),
            (sc.SPAN_SAMPLE, fwd_end, samp_end),
            (sc.SPAN_POSTPROCESS, samp_end, post_end),
        ):
            extra = {sc.LLM_ENGINE_ID: cfg.engine_id} if name == sc.SPAN_FORWARD else None
            self.window.append(_span(self.win_trace, ids.span(), step_span, name, a, b, extra))
        for r in new:
            r.first_token, r.done_tokens = samp_end, 1
        for r in decode:
            r.done_tokens += 1
        self.running = [r for r in batch if r.done_tokens < r.output_tokens]
        finished = [r for r in batch if r.done_tokens >= r.output_tokens]
        for r in finished:
            r.end, r.last_step = post_end, self.step_id
        self.now = post_end
        self.step_id += 1
        self.steps_in_window += 1
        if self.step_id % cfg.gc_every_steps == 0:
            gc_end = self.now + int(cfg.gc_ms * _MS)
            self.window.append(
                _span(
                    self.win_trace,
                    ids.span(),
                    self.win_span,
                    sc.SPAN_GC,
                    self.now,
                    gc_end,
                    {sc.LLM_GC_GENERATION: 2},
                )
            )
            self.now = gc_end
        return finished


def simulate(cfg: SimConfig) -> Iterator[dict[str, Any]]:
    """Yield OTLP ``ExportTraceServiceRequest`` dicts: one per engine window, one per request."""
    rng = random.Random(cfg.seed)
    ids = _Ids(rng)
    arrivals = _arrivals(cfg, rng, ids)
    eng = _Engine(cfg, ids)
    ai = 0
    while ai < len(arrivals) or eng.waiting or eng.running:
        while ai < len(arrivals) and arrivals[ai].arrival <= eng.now:
            r = arrivals[ai]
            r.queued = r.arrival + int((0.05 + r.input_tokens * 0.0002) * _MS)
            eng.waiting.append(r)
            ai += 1
        if not eng.waiting and not eng.running:  # idle: close the window, sleep until the next arrival
            yield from eng.close_window()
            eng.now = max(eng.now, arrivals[ai].arrival)
            eng.win_start = eng.now
            continue
        ready = [r for r in eng.waiting if r.queued <= eng.now]
        if not ready and not eng.running:
            eng.now = min(r.queued for r in eng.waiting)
            continue
        for r in eng.step(ready):
            yield _request_doc(cfg, r, ids)
        if eng.steps_in_window >= cfg.window_steps:
            yield from eng.close_window()
    yield from eng.close_window()


def _window_doc(
    cfg: SimConfig,
    spans: list[dict[str, Any]],
    trace_id: str,
    span_id: str,
    start: int,
    end: int,
    step_id: int,
) -> dict[str, Any]:
    steps = sum(1 for s in spans if s["name"] == sc.SPAN_STEP)
    root = _span(
        trace_id,
        span_id,
        None,
        sc.SPAN_ENGINE,
        start,
        end,
        {sc.LLM_ENGINE_ID: cfg.engine_id, sc.LLM_ENGINE_WINDOW_STEPS: steps},
    )
    return _doc(cfg.service, [root, *spans])


def _request_doc(cfg: SimConfig, r: _Req, ids: _Ids) -> dict[str, Any]:
    t, req = r.trace_id, r.span_ids.setdefault("request", ids.span())
    server = ids.span()
    srv_start, srv_end = r.arrival - int(0.3 * _MS), r.end + int(0.5 * _MS)
    tok_end = r.arrival + int((0.05 + r.input_tokens * 0.0002) * _MS)
    e2e = (r.end - r.arrival) / 1e9
    spans = [
        _span(
            t,
            server,
            None,
            "POST /v1/completions",
            srv_start,
            srv_end,
            {"http.request.method": "POST"},
            kind=2,
        ),
        _span(
            t,
            req,
            server,
            sc.SPAN_REQUEST,
            r.arrival,
            r.end,
            {
                sc.LLM_REQUEST_ID: f"cmpl-{r.rid}",
                sc.GEN_AI_REQUEST_MODEL: "sim-1b",
                sc.GEN_AI_USAGE_INPUT_TOKENS: r.input_tokens,
                sc.GEN_AI_USAGE_OUTPUT_TOKENS: r.output_tokens,
                sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: (r.first_token - r.arrival) / 1e9,
                sc.GEN_AI_LATENCY_E2E: e2e,
                sc.GEN_AI_LATENCY_TIME_IN_QUEUE: (r.first_sched - tok_end) / 1e9,
                sc.LLM_PREEMPTIONS: 0,
                sc.LLM_STEP_FIRST_ID: r.first_step,
                sc.LLM_STEP_LAST_ID: r.last_step,
                sc.LLM_REQUEST_FINISH_REASON: sc.FINISH_LENGTH,
            },
        ),
        _span(t, ids.span(), req, sc.SPAN_TOKENIZE, r.arrival, tok_end, {sc.LLM_TOKENIZE_TOKENS: r.input_tokens}),
        _span(t, ids.span(), req, sc.SPAN_QUEUE, tok_end, r.first_sched, {sc.LLM_QUEUE_INDEX: 0}),
        _span(t, ids.span(), req, sc.SPAN_PREFILL, r.first_sched, r.first_token),
        _span(t, ids.span(), req, sc.SPAN_DECODE, r.first_token, r.end),
    ]
    return _doc(cfg.service, spans)


def write_jsonl(path: str, cfg: SimConfig) -> int:
    """Write the simulation as OTLP JSON lines (gzip when ``path`` ends in .gz); return spans."""
    import gzip

    n = 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for doc in simulate(cfg):
            n += len(doc["resourceSpans"][0]["scopeSpans"][0]["spans"])
            fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return n
