"""analyze joins a load client's CLIENT spans to the server's requests: client - server TTFT per
request and per step, the per-step phase breakdown; nothing when no client span is there."""

from __future__ import annotations

from llmtrace import semconv as sc
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.model import Span, SpanKind
from llmtrace.analysis.summary import analyze, to_json
from tests.analysis.builders import request_trace, span


def _client_request(trace: str, start: float, queue: float, step: int, client_ttft_ms: float,
                    pool_wait_ms: float = 0.0, send_lag_ms: float = 0.0) -> list[Span]:
    """CLIENT (sent 2 ms before the server's start, due *send_lag_ms* before that) -> SERVER ->
    llm.request with 1/queue/5/20 ms phases."""
    server_side = request_trace(trace, start, 1.0, queue, 5.0, 20.0, server_pad=1.0)
    server = server_side[0]
    client = span("text_completion m", start - 2.0 - send_lag_ms, start + 1.0 + queue + 5.0 + 20.0 + 2.0,
                  trace=trace, kind=SpanKind.CLIENT,
                  attrs={sc.LLM_LOAD_STEP: step, sc.LLM_LOAD_STEP_LABEL: f"qps={2 ** step}",
                         sc.LLM_CLIENT_TTFT_S: client_ttft_ms / 1e3, sc.LLM_LOAD_POOL_WAIT_S: pool_wait_ms / 1e3,
                         sc.LLM_LOAD_SEND_LAG_S: send_lag_ms / 1e3})
    return [client, server._replace(parent_id=client.span_id), *server_side[1:]]


def test_client_minus_server_ttft_and_the_breakdown_per_step() -> None:
    spans = [*_client_request("a" * 32, 0.0, 0.0, 0, 10.0), *_client_request("b" * 32, 100.0, 0.0, 0, 10.0),
             *_client_request("c" * 32, 200.0, 30.0, 1, 41.0)]
    client = to_json(analyze(build_traceset(spans)))["client"]
    assert 3 == client["requests"]
    # server TTFT = tokenize + queue + prefill: 6 ms, 6 ms, 36 ms -> deltas 4, 4, 5 ms
    assert [0.004, 0.004, 0.005] == [round(r["ttft_delta_s"], 6) for r in client["per_request"]]
    assert ["qps=1", "qps=2"] == [s["label"] for s in client["steps"]]
    assert 0.0 == client["steps"][0]["breakdown"]["queue"]
    assert client["steps"][1]["breakdown"]["queue"] > 0.4


def test_no_client_section_without_client_spans() -> None:
    spans = request_trace("d" * 32, 0.0, 1.0, 2.0, 5.0, 20.0, server_pad=1.0)
    assert "client" not in to_json(analyze(build_traceset(spans)))


def test_the_clients_own_pool_wait_is_not_counted_as_network() -> None:
    """A request that waited 30 ms for a connection of the client's pool: those 30 ms are
    reported as the pool's, and client - server TTFT keeps only the time outside both queues."""
    spans = [*_client_request("e" * 32, 0.0, 0.0, 0, 40.0, pool_wait_ms=30.0),
             *_client_request("f" * 32, 100.0, 0.0, 0, 10.0)]
    client = to_json(analyze(build_traceset(spans)))["client"]
    assert [0.004, 0.004] == [round(r["ttft_delta_s"], 6) for r in client["per_request"]]
    assert 0.015 == client["pool_wait_s"]["mean"]


def test_client_e2e_counts_from_the_actual_send_not_from_the_spans_start() -> None:
    """The CLIENT span starts at the intended send time; a request sent 3 ms late has the same
    client - server e2e as one sent on time (the late send is the client's, not the network's)."""
    spans = [*_client_request("1" * 32, 0.0, 0.0, 0, 10.0, send_lag_ms=3.0),
             *_client_request("2" * 32, 100.0, 0.0, 0, 10.0)]
    client = to_json(analyze(build_traceset(spans)))["client"]
    late, on_time = client["per_request"]
    assert round(on_time["client_e2e_s"], 6) == round(late["client_e2e_s"], 6)
    assert 0.0 == round(client["e2e_delta_s"]["p99"] - client["e2e_delta_s"]["p50"], 6)
