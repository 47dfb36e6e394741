"""The report's definitions on constructed results: goodput, capacity, the knee, the self-check,
SLO parsing, and the terminal/HTML renderings of one summary."""

from __future__ import annotations

import pytest

from llmtrace.errors import LLMTraceError
from llmtrace.load.html import render_html
from llmtrace.load.model import Chaos, Outcome, RequestResult, RunResult, SelfCheck, Slo, Step
from llmtrace.load.report import knee, saturated_at, summarize
from llmtrace.load.slo import parse_slo
from llmtrace.load.terminal import render

STEPS = (Step(0, 0.0, 10.0, qps=1.0), Step(1, 10.0, 10.0, qps=2.0), Step(2, 20.0, 10.0, qps=4.0))


def _ok(index: int, step: int, ttft: float, e2e: float, tpot: float = 0.02) -> RequestResult:
    return RequestResult(index=index, step=step, scheduled_s=STEPS[step].start_s + index % 10, send_lag_s=0.001,
                         outcome=Outcome.OK, input_tokens=100, output_tokens=10, ttft_s=ttft, e2e_s=e2e, tpot_s=tpot)


def _run(results: list[RequestResult], lag: float = 0.001, cpu: float = 1.0) -> RunResult:
    return RunResult(url="http://x", endpoint="/v1/completions", profile="steps", steps=STEPS, results=tuple(results),
                     wall_s=30.0, self_check=SelfCheck(lag, lag, lag, cpu, 30.0, 1))


def _constructed() -> list[RequestResult]:
    """Step 0: 10 fast requests. Step 1: 20 requests, one over the TTFT SLO (p99 over it).
    Step 2: 40 requests, slow, plus a server error and two chaos clients."""
    results = [_ok(i, 0, 0.1, 1.0) for i in range(10)]
    results += [_ok(10 + i, 1, 0.2, 1.2) for i in range(19)] + [_ok(29, 1, 0.9, 2.0)]
    results += [_ok(30 + i, 2, 0.6, 3.0) for i in range(40)]
    results.append(RequestResult(index=70, step=2, scheduled_s=25.0, send_lag_s=0.0, outcome=Outcome.HTTP_ERROR,
                                 input_tokens=100, status=500, error="HTTP 500: boom", e2e_s=0.1))
    results += [RequestResult(index=71 + i, step=2, scheduled_s=26.0, send_lag_s=0.0, outcome=Outcome.CHAOS,
                              input_tokens=100, chaos=Chaos.DISCONNECT) for i in range(2)]
    return results


def test_goodput_is_the_share_of_counted_requests_meeting_every_slo() -> None:
    """Chaos clients are left out of the denominator; the server error and the slow one count."""
    summary = summarize(_run(_constructed()), Slo(ttft_s=0.5, e2e_s=2.5))
    steps = summary["steps"]
    assert [1.0, 19 / 20, 0.0] == [s["goodput"] for s in steps]
    assert 29 / 71 == pytest.approx(summary["overall"]["goodput"])
    assert [0.0, 0.0, 1 / 41] == [s["error_ratio"] for s in steps]
    assert {"disconnect": 2} == steps[2]["chaos"]
    assert {"ok": 40, "http_error": 1, "chaos": 2} == steps[2]["outcomes"]


def test_capacity_is_the_highest_step_whose_p99_meets_the_slo() -> None:
    """Step 1's p99 TTFT is pulled over 0.5 s by its one slow request: capacity is step 0. With a
    looser TTFT objective step 1 passes; step 2 never does (e2e)."""
    assert "qps=1" == summarize(_run(_constructed()), Slo(ttft_s=0.5))["capacity"]["label"]
    assert "qps=2" == summarize(_run(_constructed()), Slo(ttft_s=1.0, e2e_s=2.5))["capacity"]["label"]
    assert summarize(_run(_constructed()), Slo(ttft_s=0.05))["capacity"] is None
    assert summarize(_run(_constructed()), Slo())["capacity"] is None


def test_the_knee_is_the_last_step_on_the_latency_plateau() -> None:
    """Median e2e 1.0 -> 1.2 (plateau) -> 3.0 (left it): the knee is step 1."""
    knee = summarize(_run(_constructed()), Slo())["knee"]
    assert ("qps=2", "qps=4") == (knee["label"], knee["next_label"])


def test_a_step_that_leaves_the_plateau_and_comes_back_is_not_the_knee() -> None:
    """Median e2e 1.0, 3.0 (a stalled step), 1.1, then 4.0 and 5.0: the knee is the 1.1 step,
    after which latency stays off the plateau; the first saturated step likewise."""
    def step(i: int, e2e: float, achieved: float) -> dict[str, object]:
        return {"step": i, "label": f"qps={2 ** i}", "concurrency": None, "offered_qps": 2.0 ** i,
                "sent_qps": 2.0 ** i, "achieved_qps": achieved, "e2e_s": {"p50": e2e}}
    steps = [step(0, 1.0, 1.0), step(1, 3.0, 1.0), step(2, 1.1, 4.0), step(3, 4.0, 5.0), step(4, 5.0, 5.0)]
    found = knee(steps)
    assert found is not None and ("qps=4", "qps=8") == (found["label"], found["next_label"])
    assert "qps=8" == saturated_at(steps)
    assert knee(steps[:3]) is None and saturated_at(steps[:3]) is None


def test_the_self_check_warns_when_the_client_is_the_bottleneck() -> None:
    assert [] == summarize(_run(_constructed()), Slo())["warnings"]
    lagging = summarize(_run(_constructed(), lag=0.02), Slo())["warnings"]
    assert 1 == len(lagging) and "send lag p99 20.0 ms" in lagging[0]
    busy = summarize(_run(_constructed(), cpu=29.0), Slo())["warnings"]
    assert 1 == len(busy) and "97% of a core" in busy[0]


def test_slo_text_parses_units_and_rejects_junk() -> None:
    assert Slo(ttft_s=0.5, tpot_s=0.05, e2e_s=10.0) == parse_slo("ttft=500ms,tpot=50ms,e2e=10s")
    assert Slo(ttft_s=2.0) == parse_slo("ttft=2")
    for bad, message in (("ttft", "not KEY=DURATION"), ("p99=1s", "not KEY=DURATION"), ("ttft=fast", "not a duration"),
                         ("ttft=-1s", "must be positive"), ("", "no objective")):
        with pytest.raises(LLMTraceError, match=message):
            parse_slo(bad)


def test_renderings_show_capacity_knee_and_errors() -> None:
    summary = summarize(_run(_constructed()), Slo(ttft_s=0.5))
    text = render(summary)
    assert "capacity: qps=1" in text
    assert "knee: latency leaves its plateau after qps=2" in text
    assert "error x1: HTTP 500: boom" in text
    page = render_html(summary)
    assert page.count("<svg") >= 4
    assert "http://x" in page and "<script src" not in page
