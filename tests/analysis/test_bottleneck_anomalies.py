"""Bottleneck classes from their evidence, and robust anomaly detection."""

from __future__ import annotations

from typing import Any

import pytest

from llmtrace.analysis.anomalies import bucket_of, find_anomalies
from llmtrace.analysis.bottleneck import Bottleneck, Features, diagnose
from llmtrace.analysis.build import build_traceset
from tests.analysis.builders import request_trace

BASE: dict[str, Any] = dict(
    busy_ratio=0.5,
    idle_with_work_ratio=0.0,
    host_cause_share={},
    upstream_share=0.0,
    preemptions_per_request=0.0,
    kv_usage_p90=0.3,
    queue_share=0.05,
    queue_growth=0.0,
    network_share=0.01,
    mean_batch=4.0,
)


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"busy_ratio": 0.95}, Bottleneck.COMPUTE),
        (
            {"busy_ratio": 0.7, "idle_with_work_ratio": 0.25, "host_cause_share": {"schedule": 0.8}},
            Bottleneck.HOST,
        ),
        ({"preemptions_per_request": 0.3, "kv_usage_p90": 0.99}, Bottleneck.MEMORY),
        ({"busy_ratio": 0.97, "queue_share": 0.6, "queue_growth": 2.0}, Bottleneck.QUEUEING),
        ({"network_share": 0.4}, Bottleneck.NETWORK),
        ({}, Bottleneck.NONE),
    ],
)
def test_each_class_is_chosen_from_its_evidence(over: dict[str, Any], expected: Bottleneck) -> None:
    """The class with the strongest evidence wins; weak evidence everywhere is 'none'."""
    d = diagnose(Features(**{**BASE, **over}))
    assert expected == d.cls
    assert d.recommendation
    assert "gpu_busy_ratio" in d.evidence


def test_host_recommendation_names_the_dominant_host_cause() -> None:
    """The recommendation points at the host activity that owns most of the idle time."""
    d = diagnose(
        Features(**{**BASE, "idle_with_work_ratio": 0.3, "host_cause_share": {"gc": 0.7, "schedule": 0.3}})
    )
    assert "garbage-collector" in d.recommendation


def test_an_engine_idle_with_its_own_queue_empty_is_starved_by_the_front_end() -> None:
    """Host-bound idle mostly while the engine held no request: the advice is the front end,
    not the engine loop; below the threshold the host cause is named as before."""
    host = {**BASE, "idle_with_work_ratio": 0.3, "host_cause_share": {"other": 0.9}}
    starved = diagnose(Features(**{**host, "upstream_share": 0.8}))
    assert Bottleneck.HOST == starved.cls
    assert "front end" in starved.recommendation
    assert 0.8 == starved.evidence["idle_with_work_upstream_share"]
    loop = diagnose(Features(**{**host, "upstream_share": 0.2}))
    assert "front end" not in loop.recommendation
    assert "profile the engine loop" in loop.recommendation


def test_input_length_buckets_are_powers_of_two() -> None:
    """Bucket boundaries: 1, 2-3, 4-7, ..."""
    assert [bucket_of(n) for n in (1, 64, 127, 128, None)] == [
        "1-1",
        "64-127",
        "64-127",
        "128-255",
        "unknown",
    ]


def test_one_slow_request_among_peers_is_an_anomaly_with_its_dominant_segment() -> None:
    """Nine similar requests and one whose queue wait is 10x: flagged on TTFT and e2e, blamed on the queue."""
    spans = []
    for i in range(9):
        spans += request_trace(f"{i:032x}", i * 100, 1, 2 + 0.1 * i, 5, 20, input_tokens=100)
    spans += request_trace("f" * 32, 1000, 1, 50, 5, 20, input_tokens=100)
    ts = build_traceset(spans)
    dominant = {(r.request.span_id, m): ("llm.queue", 0.05) for r in ts.requests for m in ("ttft_s", "e2e_s")}
    found = find_anomalies(ts.requests, dominant)
    assert {("f" * 32, "ttft_s"), ("f" * 32, "e2e_s")} == {(a.trace_id, a.metric) for a in found}
    assert {"llm.queue"} == {a.dominant_segment for a in found}


def test_small_buckets_are_not_judged() -> None:
    """Fewer than MIN_BUCKET peers: no anomalies, however different."""
    spans = request_trace("a" * 32, 0, 1, 2, 3, 4) + request_trace("b" * 32, 0, 1, 200, 3, 4)
    assert [] == find_anomalies(build_traceset(spans).requests, {})


def test_without_an_engine_timeline_engine_limits_are_unmeasured_not_absent() -> None:
    """Requests only (vLLM's own tracing, a front end traced alone): the queue share alone can
    name queueing, and 'none' says the engine was not observed instead of claiming headroom."""
    blind = {**BASE, "busy_ratio": 0.0, "kv_usage_p90": 0.0, "mean_batch": 0.0, "engine_observed": False}
    quiet = diagnose(Features(**blind))
    assert Bottleneck.NONE == quiet.cls
    assert "headroom" not in quiet.recommendation and "no engine timeline" in quiet.recommendation
    assert Bottleneck.QUEUEING == diagnose(Features(**{**blind, "queue_share": 0.6})).cls
    # With an engine observed idle half the time, the same queue share is not called queueing.
    assert Bottleneck.QUEUEING != diagnose(Features(**{**BASE, "queue_share": 0.6})).cls
