"""The request lifecycle: events on the hot path -> phases, statistics and spans at the end."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from llmtrace import RequestTracker, semconv, start_request
from llmtrace.lifecycle.propagation import extract
from llmtrace.lifecycle.stats import token_timing
from tests.core.conftest import Captured, InstallRuntime

MS = 1_000_000


def test_token_timing_known_answer() -> None:
    """TTFT from arrival; TPOT = (last - first) / (n - 1); ITL percentiles over the gaps."""
    timing = token_timing(0, [100 * MS, 110 * MS, 130 * MS, 160 * MS])
    assert 0.1 == pytest.approx(timing.ttft_s)
    assert 0.02 == pytest.approx(timing.tpot_s)
    assert 0.02 == pytest.approx(timing.itl_mean_s)
    assert 0.02 == pytest.approx(timing.itl_p50_s)
    assert 0.03 == pytest.approx(timing.itl_max_s)
    assert 0.0298 == pytest.approx(timing.itl_p99_s)


def test_phases_from_events_with_a_preemption(captured: Captured) -> None:
    """queue/prefill/decode come from the event times; a preemption adds a second llm.queue."""
    handle = start_request("r1", model="m", arrival_ns=0)
    handle.tokenized(5, 0, 1 * MS)
    handle.queued(at_ns=1 * MS)
    handle.scheduled(step_id=7, at_ns=4 * MS)
    handle.token(at_ns=10 * MS)
    handle.token(at_ns=20 * MS)
    handle.preempted(at_ns=21 * MS)
    handle.scheduled(step_id=9, at_ns=30 * MS)
    handle.token(at_ns=40 * MS)
    handle.finished("length", at_ns=41 * MS)
    spans = {s.name: s for s in captured.spans() if s.name != semconv.SPAN_QUEUE}
    queues = sorted(captured.named(semconv.SPAN_QUEUE), key=lambda s: s.start_time or 0)
    assert [(1 * MS, 4 * MS), (21 * MS, 30 * MS)] == [
        (q.start_time - spans[semconv.SPAN_REQUEST].start_time, q.end_time - spans[semconv.SPAN_REQUEST].start_time)
        for q in queues]
    request = spans[semconv.SPAN_REQUEST]
    attrs = request.attributes or {}
    assert 4 * MS == spans[semconv.SPAN_PREFILL].start_time - request.start_time
    assert 10 * MS == spans[semconv.SPAN_PREFILL].end_time - request.start_time
    assert 30 * MS == spans[semconv.SPAN_DECODE].end_time - spans[semconv.SPAN_DECODE].start_time
    assert 1 == attrs[semconv.LLM_PREEMPTIONS]
    assert 0.012 == pytest.approx(attrs[semconv.GEN_AI_LATENCY_TIME_IN_QUEUE])
    assert 0.009 == pytest.approx(attrs[semconv.LLM_DECODE_STALL_S])
    assert 0.01 == pytest.approx(attrs[semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN])
    assert 0.041 == pytest.approx(attrs[semconv.GEN_AI_LATENCY_E2E])
    assert (7, 9) == (attrs[semconv.LLM_STEP_FIRST_ID], attrs[semconv.LLM_STEP_LAST_ID])
    assert 5 == attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS]
    assert 3 == attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    for child in (q for q in queues):
        assert request.context.span_id == child.parent.span_id


def test_request_span_is_a_child_of_the_carrier(captured: Captured) -> None:
    """Given a traceparent, llm.request joins that trace as a child of the caller's span."""
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    start_request("r2", carrier=carrier).finished()
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert 0x0AF7651916CD43DD8448EB211C80319C == request.context.trace_id
    assert 0xB7AD6B7169203331 == request.parent.span_id


def test_abort_and_error_end_the_request_with_error_status(captured: Captured) -> None:
    """A disconnect ends as abort, an exception as error with its type; both are status ERROR."""
    start_request("gone").aborted()
    start_request("boom").aborted(ValueError("bad"))
    spans = {s.attributes[semconv.LLM_REQUEST_ID]: s for s in captured.named(semconv.SPAN_REQUEST)}
    assert "abort" == spans["gone"].attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert StatusCode.ERROR == spans["gone"].status.status_code
    assert "error" == spans["boom"].attributes[semconv.LLM_REQUEST_FINISH_REASON]
    assert "ValueError" == spans["boom"].status.description
    assert any(e.name == "exception" for e in spans["boom"].events)


def test_context_manager_ends_the_request_on_exception(captured: Captured) -> None:
    """``with start_request(...)``: the host's exception propagates untouched and ends the request as error."""
    with pytest.raises(KeyError), start_request("cm"):
        raise KeyError("host bug")
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert "error" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]


def test_events_after_the_end_are_ignored(captured: Captured) -> None:
    """A late token or a second finish changes nothing."""
    handle = start_request("late", arrival_ns=0)
    handle.token(at_ns=MS)
    handle.finished(at_ns=2 * MS)
    handle.token(at_ns=3 * MS)
    handle.finished("length", at_ns=4 * MS)
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert 1 == request.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS]
    assert "stop" == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]


def test_unknown_request_id_is_logged_once_and_ignored(captured: Captured, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracker never raises into the engine loop for an id it never saw."""
    from llmtrace import _safety

    monkeypatch.setattr(_safety, "_warned", set())  # once per process: other tests may have logged it
    tracker = RequestTracker()
    with caplog.at_level(logging.WARNING, logger="llmtrace"):
        tracker.scheduled("nope", 1)
        tracker.preempted("nope")
        tracker.tokens(["nope"])
        assert {} == tracker.finished("nope")
    assert 1 == sum("never saw" in r.getMessage() for r in caplog.records)


def test_malformed_carrier_starts_a_new_trace(captured: Captured, caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage traceparent is ignored with one warning; the request still gets a span."""
    from llmtrace import _safety

    monkeypatch.setattr(_safety, "_warned", set())  # once per process: other tests may have logged it
    with caplog.at_level(logging.WARNING, logger="llmtrace"):
        assert not extract({"traceparent": "garbage"})
        start_request("bad-carrier", carrier={"traceparent": "not-a-traceparent"}).finished()
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert request.parent is None
    assert any("malformed trace carrier" in r.getMessage() for r in caplog.records)


def test_serving_metrics_are_recorded_from_the_same_records(captured: Captured) -> None:
    """TTFT, request duration and token histograms come from finished requests."""
    handle = start_request("m1", prompt_tokens=3, arrival_ns=0)
    handle.token(at_ns=50 * MS)
    handle.token(at_ns=60 * MS)
    handle.finished(at_ns=61 * MS)
    metrics = captured.metrics()
    ttft = metrics[semconv.METRIC_TTFT].data.data_points[0]
    assert 1 == ttft.count and 0.05 == pytest.approx(ttft.sum)
    assert 1 == metrics[semconv.METRIC_REQUEST_DURATION].data.data_points[0].count
    assert list(semconv.TTFT_BUCKETS) == list(ttft.explicit_bounds)


def test_capture_content_is_off_by_default_and_truncates_when_on(runtime_with: InstallRuntime) -> None:
    """Prompt text is recorded only with capture_content=True, cut to capture_content_max_chars."""
    captured = runtime_with()
    start_request("quiet", prompt="secret prompt").finished(completion="secret answer")
    captured = runtime_with(capture_content=True, capture_content_max_chars=6)
    start_request("loud", prompt="secret prompt").finished(completion="secret answer")
    (loud,) = captured.named(semconv.SPAN_REQUEST)
    assert "secret" == loud.attributes[semconv.GEN_AI_PROMPT]
    assert "secret" == loud.attributes[semconv.GEN_AI_COMPLETION]


def test_no_content_without_opt_in(captured: Captured) -> None:
    """Default settings: neither prompt nor completion appear on the span."""
    start_request("quiet", prompt="secret prompt").finished(completion="secret answer")
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert semconv.GEN_AI_PROMPT not in request.attributes
    assert semconv.GEN_AI_COMPLETION not in request.attributes


def test_llmtraces_own_cpu_time_is_a_metric(captured: Captured) -> None:
    """``llmtrace.overhead.cpu_time``: the span builder's CPU, growing as it builds spans."""

    def builder_cpu() -> float:
        points = captured.metrics()[semconv.METRIC_OVERHEAD_CPU].data.data_points
        return float(next(p.value for p in points if p.attributes[semconv.LLMTRACE_WORKER] == "span_builder"))

    before = builder_cpu()
    for i in range(50):
        handle = start_request(f"cpu{i}", prompt_tokens=3, arrival_ns=0)
        handle.token(at_ns=5 * MS)
        handle.finished(at_ns=6 * MS)
    assert builder_cpu() > before


def test_the_tracer_is_made_once_per_provider(runtime_with: Any) -> None:
    """The tracer is cached for its provider; a new provider (a new runtime) gets its own,
    and the request span goes to the new provider's exporter, not the old one's."""
    from llmtrace import _runtime

    first = runtime_with()
    tracer = _runtime.tracer()
    assert tracer is _runtime.tracer()
    second = runtime_with()
    assert _runtime.tracer() is not tracer
    handle = start_request("after-switch", arrival_ns=0)
    handle.finished(at_ns=MS)
    assert ["after-switch"] == [s.attributes[semconv.LLM_REQUEST_ID] for s in second.named(semconv.SPAN_REQUEST)]
    assert [] == first.named(semconv.SPAN_REQUEST)


def test_server_scope_recording_follows_the_requests_that_register(captured: Captured) -> None:
    """A streamed decode asks its server call whether anything in it is sampled, once per token (a
    plain attribute): a request opened in the call later, sampled, makes it true."""
    from llmtrace.lifecycle.scope import ServerScope, enter_scope, exit_scope

    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    dropped = {"traceparent": f"00-{trace_id}-{parent_id}-00"}
    kept = {"traceparent": f"00-{'1' * 32}-{parent_id}-01"}
    scope = ServerScope(context=extract(dropped))
    token = enter_scope(scope)
    try:
        assert not scope.recording
        first = start_request("dropped", carrier=dropped)
        assert not first.recording and not scope.recording
        second = start_request("kept", carrier=kept)
        assert second.recording and scope.recording
    finally:
        exit_scope(token)
    first.finished()
    second.finished()


def test_a_carrier_that_is_no_mapping_never_raises(captured: Captured, caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that carries only the traceparent value gets it honoured; one that carries something
    else entirely (a list, a number) gets a new trace and one log line — no exception into its loop."""
    from llmtrace import _safety

    monkeypatch.setattr(_safety, "_warned", set())  # once per process: other tests may have logged it
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    tracker = RequestTracker()
    tracker.add("bare", carrier=f"00-{trace_id}-{parent_id}-01")
    with caplog.at_level(logging.WARNING, logger="llmtrace"):
        tracker.add("junk", carrier=[("traceparent",)])  # type: ignore[arg-type]
    tracker.finished("bare")
    tracker.finished("junk")
    by_id = {span.attributes[semconv.LLM_REQUEST_ID]: span for span in captured.named(semconv.SPAN_REQUEST)}
    assert by_id.keys() == {"junk"}  # "bare" has a carrier: its llm.request is the other process's span
    assert by_id["junk"].parent is None
    [queue] = [span for span in captured.named(semconv.SPAN_QUEUE) if span.context.trace_id == int(trace_id, 16)]
    assert int(parent_id, 16) == queue.parent.span_id
    assert any("malformed trace carrier" in record.getMessage() for record in caplog.records)


def test_spans_follow_a_wall_clock_that_moves_against_the_monotonic_one(
        captured: Captured, monkeypatch: pytest.MonkeyPatch) -> None:
    """NTP slews the wall clock and a VM's clock is corrected (5 ms/s on the CI VM) or stepped:
    llmtrace's spans, converted from monotonic time, stay aligned with the SDK's, which read the
    wall clock (a request never starts before its SERVER span), and one request's spans share
    one offset, so their nesting is exactly the monotonic one."""
    import time

    from llmtrace import _runtime
    from llmtrace.lifecycle import clock

    real_time_ns = time.time_ns
    step = [0]
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + step[0])
    clock.reset_offset()
    step[0] = 250_000_000  # the wall clock jumps 250 ms after the offset was first taken
    # The SDK reads the wall clock for its own spans (its clock function is bound at import,
    # so it is given the moved wall clock explicitly here).
    with _runtime.tracer().start_as_current_span("POST /v1/completions", start_time=time.time_ns()):
        arrival = clock.monotonic_ns()
        handle = start_request("drift", arrival_ns=arrival)
        handle.queued(arrival + 1_000_000)
        handle.scheduled(at_ns=arrival + 3_000_000)
        handle.token(at_ns=arrival + 5_000_000)
        step[0] += 5_000_000  # and keeps moving while the request runs
        handle.token(at_ns=arrival + 9_000_000)
        handle.finished(at_ns=arrival + 10_000_000)
    monkeypatch.setattr(time, "time_ns", real_time_ns)
    clock.reset_offset()
    (request,) = captured.named(semconv.SPAN_REQUEST)
    (server,) = captured.named("POST /v1/completions")
    assert request.parent is not None and server.context is not None
    assert request.parent.span_id == server.context.span_id
    assert request.start_time is not None and server.start_time is not None
    assert abs(request.start_time - server.start_time) < 5_000_000  # 250 ms apart with a start-up offset
    (queue,) = captured.named(semconv.SPAN_QUEUE)
    (decode,) = captured.named(semconv.SPAN_DECODE)
    assert 1_000_000 == queue.start_time - request.start_time
    assert 10_000_000 == request.end_time - request.start_time
    assert (5_000_000, 9_000_000) == (decode.start_time - request.start_time, decode.end_time - request.start_time)


@pytest.mark.parametrize("sampled", [True, False])
def test_request_under_a_parent_follows_its_sampling_decision(captured: Captured, sampled: bool) -> None:
    """Parent-based, as the SDK decides: under a sampled parent llm.request is recorded and
    exported; under an unsampled one it is a non-recording span of the same trace with its own
    id (made without the sampler call), and nothing is exported."""
    flags = "01" if sampled else "00"
    handle = start_request("r-sampling", carrier={"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-{flags}"})
    context = handle.span.get_span_context() if handle.span is not None else None
    handle.finished()
    assert context is not None
    assert (sampled, int("ab" * 16, 16)) == (handle.recording, context.trace_id)
    assert context.span_id not in (0, int("cd" * 8, 16))
    assert sampled == context.trace_flags.sampled
    exported = [s for s in captured.spans() if s.name == semconv.SPAN_REQUEST]
    assert (1 if sampled else 0) == len(exported)


def test_cancelled_task_inside_the_request_block_ends_it_as_abort(captured: Captured) -> None:
    """A task cancelled inside ``with start_request()`` (a client that went away, a cancelled
    RPC) ends the request as abort, not as an error of the server."""
    import asyncio

    async def handler() -> None:
        with start_request("cancelled"):
            await asyncio.sleep(3600)

    async def run() -> None:
        task = asyncio.ensure_future(handler())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert semconv.FINISH_ABORT == request.attributes[semconv.LLM_REQUEST_FINISH_REASON]


FIRST_TOKEN_KEYS = ("queue_s", "prefill_s", "preemptions", "first_step", "cached_tokens", "transferred_tokens")


@pytest.mark.parametrize("story", ["first token", "preempted before it", "cached prompt", "never scheduled",
                                   "aborted in prefill", "unqueued"])
def test_first_token_summary_is_the_full_summarys_first_token_part(captured: Captured, story: str) -> None:
    """Known answers for what an engine sends with a request's first token, and the same values as
    the whole summary's, which it skips computing."""
    tracker = RequestTracker()
    handle = tracker.add("f", arrival_ns=0) if story != "unqueued" else start_request("f", arrival_ns=0)
    expected: dict[str, Any] = {"queue_s": 0.0, "preemptions": 0}
    if story != "never scheduled":
        handle.scheduled(step_id=7, at_ns=2 * MS)
        expected.update(queue_s=0.002 if story != "unqueued" else 0.0, first_step=7)
    if story == "preempted before it":
        handle.preempted(at_ns=3 * MS)
        handle.scheduled(step_id=9, at_ns=5 * MS)
        expected.update(queue_s=0.004, preemptions=1)
    if story == "cached prompt":
        handle.prompt_cached(32, 8)
        expected.update(cached_tokens=32, transferred_tokens=8)
    if story == "aborted in prefill":
        handle.aborted(at_ns=6 * MS)
        expected["prefill_s"] = 0.004
    elif story != "never scheduled":
        handle.token(at_ns=10 * MS)
        expected["prefill_s"] = 0.008
    first = handle.first_token_summary()
    assert expected == pytest.approx(first)
    full = handle.summary()
    assert {k: full[k] for k in FIRST_TOKEN_KEYS if k in full} == first


def test_in_span_says_what_the_api_says_about_the_current_span(captured: Captured) -> None:
    """``in_span()`` (the vLLM adapter's test for a SERVER span to join) agrees with
    ``get_current_span().get_span_context().is_valid``: no span, a live span, an invalid span, a
    remote parent from a carrier, and a non-span object left under the API's key."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    from llmtrace import _runtime
    from llmtrace.lifecycle.current import SPAN_KEY
    from llmtrace.lifecycle.request import in_span

    def agrees(expected: bool) -> None:
        assert expected == trace.get_current_span().get_span_context().is_valid == in_span()

    agrees(False)
    with _runtime.tracer().start_as_current_span("POST /v1/completions"):
        agrees(True)
    for parent, expected in ((trace.set_span_in_context(trace.INVALID_SPAN), False),
                             (extract({"traceparent": f"00-{7:032x}-{9:016x}-00"}), True),
                             (otel_context.set_value(SPAN_KEY, "not a span"), False)):
        token = otel_context.attach(parent)
        try:
            agrees(expected)
        finally:
            otel_context.detach(token)
