"""The Jaeger client against httpx.MockTransport: window splitting, 404, legacy API, failures.

The real-Jaeger counterpart is tests/analysis/test_jaeger_stack.py (marker ``stack``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import httpx
import pytest

from llmtrace.analysis.errors import EmptySourceError, SourceError
from llmtrace.analysis.sources import load_spans

T0 = 1_700_000_000_000_000_000
S = 1_000_000_000


def _ns(rfc: str) -> int:
    whole, frac = rfc.rstrip("Z").split(".")
    secs = int(datetime.fromisoformat(whole + "+00:00").timestamp())
    return secs * S + int(frac.ljust(9, "0"))


def _trace(i: int) -> dict[str, Any]:
    return {
        "traceId": f"{i:032x}",
        "spanId": f"{i:016x}",
        "name": "llm.request",
        "kind": 1,
        "startTimeUnixNano": str(T0 + i * S),
        "endTimeUnixNano": str(T0 + i * S + 1000),
    }


class FakeJaegerV3:
    """Serves 10 traces, one per second, honouring the window and search depth like Jaeger."""

    def __init__(self, n: int = 10) -> None:
        self.n = n
        self.calls: list[tuple[int, int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v3/services":
            return httpx.Response(200, json={"services": ["api", "jaeger"]})
        q = request.url.params
        lo, hi = _ns(q["query.start_time_min"]), _ns(q["query.start_time_max"])
        self.calls.append((lo, hi))
        hits = [_trace(i) for i in range(self.n) if lo <= T0 + i * S <= hi][: int(q["query.search_depth"])]
        if not hits:
            return httpx.Response(404, json={"error": {"httpCode": 404, "message": "trace not found"}})
        chunks = [
            {"result": {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [t]}]}]}} for t in hits
        ]
        return httpx.Response(200, text="\n".join(json.dumps(c) for c in chunks))


def test_full_windows_are_split_until_nothing_is_cut() -> None:
    """With a limit of 3 and 10 traces in the window, the client splits and still gets all 10."""
    fake = FakeJaegerV3()
    loaded = load_spans(
        "http://jaeger:16686",
        since_ns=T0 - S,
        until_ns=T0 + 20 * S,
        limit=3,
        transport=httpx.MockTransport(fake),
    )
    assert 10 == len({s.trace_id for s in loaded.spans})
    assert len(fake.calls) > 3


def test_no_match_is_an_empty_source_not_a_crash() -> None:
    """404 from v3 means no traces: EmptySourceError ('no spans found')."""
    with pytest.raises(EmptySourceError):
        load_spans(
            "http://jaeger:16686",
            services=["api"],
            since_ns=T0 + 100 * S,
            until_ns=T0 + 200 * S,
            transport=httpx.MockTransport(FakeJaegerV3()),
        )


def test_services_default_to_all_but_jaegers_own() -> None:
    """Without --service every service is queried except Jaeger's own."""
    fake = FakeJaegerV3()
    load_spans("http://jaeger:16686", since_ns=T0, until_ns=T0 + 20 * S, transport=httpx.MockTransport(fake))
    assert 1 == len(fake.calls)


def test_legacy_api_is_used_when_v3_is_absent() -> None:
    """A Jaeger v1 without /api/v3 is read through /api/traces (µs parameters, Jaeger JSON model)."""
    seen: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/api/v3"):
            return httpx.Response(404, text="404 page not found")
        if request.url.path == "/api/services":
            return httpx.Response(200, json={"data": ["api"]})
        seen.update(request.url.params)
        span = {
            "traceID": "ab" * 16,
            "spanID": "cd" * 8,
            "operationName": "llm.request",
            "references": [],
            "startTime": T0 // 1000,
            "duration": 5,
            "tags": [],
            "processID": "p1",
        }
        return httpx.Response(
            200,
            json={
                "data": [{"traceID": "ab" * 16, "spans": [span], "processes": {"p1": {"serviceName": "api"}}}]
            },
        )

    loaded = load_spans(
        "http://jaeger:16686", since_ns=T0, until_ns=T0 + S, transport=httpx.MockTransport(handler)
    )
    assert ["llm.request"] == [s.name for s in loaded.spans]
    assert (str(T0 // 1000), "api") == (seen["start"], seen["service"])


def test_server_error_names_url_and_status() -> None:
    """A 500 is a SourceError naming the Jaeger URL, the path and the status."""
    transport = httpx.MockTransport(lambda r: httpx.Response(500, text="storage down"))
    with pytest.raises(SourceError, match=r"http://jaeger:16686:/api/v3/traces: HTTP 500: storage down"):
        load_spans(
            "http://jaeger:16686",
            services=["api"],
            api="v3",
            since_ns=T0,
            until_ns=T0 + S,
            transport=transport,
        )
