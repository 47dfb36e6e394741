"""Client and server in one trace: what the load client saw against what the server measured.

When ``llmtrace load`` drove the server, each request's trace starts with the client's CLIENT
span and continues with the server's SERVER span and ``llm.request``::

    CLIENT  chat model        (due) send ........................ last chunk read
    └─ SERVER  POST /v1/chat/completions   |<- network + front end ->|
       └─ llm.request                         arrival ... first token ... finish

The CLIENT span starts at the request's intended send time; the client's figures here count
from its actual send (``llm.load.send_lag_s`` later), as the server's count from its arrival.
Per request, client TTFT (``llm.client.ttft_s``, from the send) minus the wait for a
connection of the client's own pool (``llm.load.pool_wait_s``, reported on its own) minus
server TTFT (``gen_ai.latency.time_to_first_token``, from ``llm.request``'s arrival) is the
time the first token spent outside the engine: network, HTTP parsing, tokenization, the
stream's way back. Per load step (``llm.load.step``) the phase breakdown and the bottleneck verdict
of the engine windows that overlap the step show what breaks first as load rises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmtrace import semconv as sc
from llmtrace.analysis.breakdown import phase_breakdown, request_phases
from llmtrace.analysis.model import RequestView, Span, SpanKind, finite_number
from llmtrace.analysis.stats import pcts

#: Per-request rows kept in the summary; the aggregates cover every request.
MAX_ROWS = 200


def client_span(r: RequestView) -> Span | None:
    """The load client's CLIENT span above this request's SERVER span, if the trace has one."""
    server = r.server
    if server is None or server.parent_id is None:
        return None
    parent = r.trace.by_id.get(server.parent_id)
    if parent is None or parent.kind != SpanKind.CLIENT:
        return None
    return parent


def _dist(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    out = pcts(values, (50, 90, 99))
    out["mean"] = sum(values) / len(values)
    return out


def _row(r: RequestView, client: Span) -> dict[str, Any]:
    client_ttft = finite_number(client.attributes.get(sc.LLM_CLIENT_TTFT_S))
    pool_wait = finite_number(client.attributes.get(sc.LLM_LOAD_POOL_WAIT_S)) or 0.0
    send_lag = finite_number(client.attributes.get(sc.LLM_LOAD_SEND_LAG_S)) or 0.0
    server_ttft = r.ttft_s
    return {
        "trace_id": r.trace.trace_id,
        "step": client.attributes.get(sc.LLM_LOAD_STEP),
        "step_label": client.attributes.get(sc.LLM_LOAD_STEP_LABEL),
        "client_ttft_s": client_ttft,
        "server_ttft_s": server_ttft,
        "pool_wait_s": pool_wait,
        "ttft_delta_s": None if client_ttft is None or server_ttft is None else client_ttft - pool_wait - server_ttft,
        "client_e2e_s": client.duration_ns / 1e9 - send_lag,
        "server_e2e_s": r.e2e_s,
        "start_ns": client.start_ns,
        "end_ns": client.end_ns,
    }


def join_client_server(requests: Sequence[RequestView],
                       verdict_between: Callable[[int, int], Mapping[str, int]]) -> dict[str, Any] | None:
    """The joined view (None when no request has a client span above it).

    ``verdict_between(start_ns, end_ns)`` counts the bottleneck classes of the engine windows
    overlapping that time range (the caller owns the window verdicts)."""
    pairs = [(r, c) for r in requests if (c := client_span(r)) is not None]
    if not pairs:
        return None
    rows = [_row(r, c) for r, c in pairs]
    deltas = [d for row in rows if (d := row["ttft_delta_s"]) is not None]
    e2e_deltas = [row["client_e2e_s"] - row["pool_wait_s"] - row["server_e2e_s"] for row in rows]
    waits = [row["pool_wait_s"] for row in rows]
    by_step: dict[Any, list[tuple[RequestView, dict[str, Any]]]] = {}
    for (r, _), row in zip(pairs, rows, strict=True):
        by_step.setdefault(row["step"], []).append((r, row))
    steps = [_step(step, members, verdict_between) for step, members in
             sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] if isinstance(kv[0], int) else 0))]
    return {
        "requests": len(rows),
        "ttft_delta_s": _dist(deltas),
        "e2e_delta_s": _dist(e2e_deltas),
        "pool_wait_s": _dist(waits) if any(waits) else None,
        "steps": steps,
        "per_request": [{k: v for k, v in row.items() if k not in ("start_ns", "end_ns")} for row in rows[:MAX_ROWS]],
    }


def _step(step: Any, members: list[tuple[RequestView, dict[str, Any]]],
          verdict_between: Callable[[int, int], Mapping[str, int]]) -> dict[str, Any]:
    views = [r for r, _ in members]
    rows = [row for _, row in members]
    phases = phase_breakdown([request_phases(r) for r in views], [r.e2e_s for r in views])
    start, end = min(row["start_ns"] for row in rows), max(row["end_ns"] for row in rows)
    classes = dict(verdict_between(start, end))
    return {
        "step": step,
        "label": rows[0]["step_label"],
        "requests": len(rows),
        "client_ttft_s": _dist([v for row in rows if (v := row["client_ttft_s"]) is not None]),
        "server_ttft_s": _dist([v for row in rows if (v := row["server_ttft_s"]) is not None]),
        "ttft_delta_s": _dist([v for row in rows if (v := row["ttft_delta_s"]) is not None]),
        "pool_wait_s": _dist([row["pool_wait_s"] for row in rows]),
        "breakdown": {p.phase: p.share for p in phases},
        "bottleneck": max(classes, key=lambda k: classes[k]) if classes else None,
        "window_classes": classes,
    }
