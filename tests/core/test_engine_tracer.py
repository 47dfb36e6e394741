"""The engine timeline: windows, steps, phases, links, sampling and gc spans."""

from __future__ import annotations

import gc
import time

import pytest

from llmtrace import EngineTracer, semconv
from tests.core.conftest import Captured, InstallRuntime


def _run_steps(engine: EngineTracer, ids: list[str], steps: int) -> None:
    for _ in range(steps):
        with engine.step() as step:
            with step.phase("schedule"):
                pass
            step.batch(ids, decode_tokens=len(ids), waiting=0, running=len(ids), kv_cache_usage=0.25)
            with step.phase("forward"):
                pass
            step.tokens()


def test_windows_close_after_n_steps_and_hold_their_steps(runtime_with: InstallRuntime) -> None:
    """engine_window_steps=4 and 10 steps: windows of 4, 4 and 2 steps, each step under its window."""
    captured = runtime_with(engine_window_steps=4, engine_window_s=3600)
    engine = EngineTracer("dp0")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 10)
    engine.flush_window()
    windows = captured.named(semconv.SPAN_ENGINE)
    steps = captured.named(semconv.SPAN_STEP)
    window_steps = [w.attributes[semconv.LLM_ENGINE_WINDOW_STEPS] for w in windows]
    assert [4, 4, 2] == sorted(window_steps, reverse=True)  # type: ignore[type-var]  # ints: the SDK types them AnyValue
    assert list(range(10)) == sorted(s.attributes[semconv.LLM_STEP_ID] for s in steps)  # type: ignore[type-var]
    window_ids = {w.context.span_id for w in windows}
    assert all(s.parent.span_id in window_ids for s in steps)
    assert all("dp0" == s.attributes[semconv.LLM_ENGINE_ID] for s in steps)
    forwards = captured.named(semconv.SPAN_FORWARD)
    assert 10 == len(forwards) and all("dp0" == f.attributes[semconv.LLM_ENGINE_ID] for f in forwards)


def test_step_links_point_at_the_requests_and_are_capped(runtime_with: InstallRuntime) -> None:
    """Each step links to its requests' spans, at most max_links of them, each link naming its request;
    batch size stays exact."""
    captured = runtime_with(max_links=2)
    engine = EngineTracer("dp1")
    ids = ["r0", "r1", "r2"]
    for rid in ids:
        engine.tracker.add(rid)
    _run_steps(engine, ids, 2)
    for rid in ids:
        engine.tracker.finished(rid)
    engine.flush_window()
    first, second = captured.named(semconv.SPAN_STEP)
    requests = {s.context.span_id: s for s in captured.named(semconv.SPAN_REQUEST)}
    for step in (first, second):
        assert 3 == step.attributes[semconv.LLM_BATCH_SIZE]
        assert 2 == len(step.links)
        for link in step.links:
            request = requests[link.context.span_id]
            assert {semconv.LLM_REQUEST_ID: request.attributes[semconv.LLM_REQUEST_ID]} == dict(link.attributes or {})
    assert [link.context for link in first.links] == [link.context for link in second.links]


def test_unsampled_windows_emit_no_spans_but_feed_metrics(runtime_with: InstallRuntime) -> None:
    """engine_sample_ratio=0: no llm.engine/llm.step spans; the batch-size histogram still counts steps."""
    captured = runtime_with(engine_sample_ratio=0.0, engine_window_steps=2)
    engine = EngineTracer("dp2")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 4)
    engine.flush_window()
    assert [] == captured.named(semconv.SPAN_STEP)
    assert [] == captured.named(semconv.SPAN_ENGINE)
    batch = captured.metrics()[semconv.METRIC_BATCH_SIZE].data.data_points[0]
    assert 4 == batch.count


@pytest.mark.parametrize("sampled", [True, False])
def test_a_batch_larger_than_its_records_is_counted_whole(runtime_with: InstallRuntime, sampled: bool) -> None:
    """An integration that keeps records of only some requests (vLLM leaves unsampled ones to the
    API server) gives the batch's size: ``llm.batch.size`` and the batch-size histogram count it,
    in a sampled and in an unsampled window, while the step links only to the records it has."""
    captured = runtime_with(engine_sample_ratio=1.0 if sampled else 0.0, engine_window_steps=2)
    engine = EngineTracer("dp5")
    handle = engine.tracker.add("kept")
    for _ in range(2):
        step = engine.begin_step()
        if sampled:
            step.batch(["kept"], decode_tokens=5, size=5)
        else:
            step.batch_handles([handle], size=5)
        engine.end_step(step)
    engine.flush_window()
    batch = captured.metrics()[semconv.METRIC_BATCH_SIZE].data.data_points[0]
    assert (2, 10) == (batch.count, batch.sum)
    steps = captured.named(semconv.SPAN_STEP)
    assert len(steps) == (2 if sampled else 0)
    for span in steps:
        assert 5 == span.attributes[semconv.LLM_BATCH_SIZE]
        assert 1 == len(span.links)


def test_sampled_window_keeps_every_step(runtime_with: InstallRuntime) -> None:
    """With request sampling at 0, engine windows (sampled by their own ratio) are still whole."""
    captured = runtime_with(sample_ratio=0.0, engine_sample_ratio=1.0,
                                      engine_window_steps=5)
    engine = EngineTracer("dp3")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 5)
    assert 5 == len(captured.named(semconv.SPAN_STEP))
    assert [] == captured.named(semconv.SPAN_REQUEST)


def test_gc_pause_inside_a_window_becomes_an_llm_gc_span(runtime_with: InstallRuntime) -> None:
    """A collection while a window is open is recorded as llm.gc under llm.engine."""
    captured = runtime_with(engine_window_steps=100)
    engine = EngineTracer("dp4")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 1)
    gc.collect()
    _run_steps(engine, ["a"], 1)
    engine.flush_window()
    gcs = captured.named(semconv.SPAN_GC)
    (window,) = captured.named(semconv.SPAN_ENGINE)
    assert gcs and all(g.parent.span_id == window.context.span_id for g in gcs)
    assert any(2 == g.attributes[semconv.LLM_GC_GENERATION] for g in gcs)


def test_request_phases_follow_step_membership(captured: Captured) -> None:
    """A request in steps 0..3 gets first/last step ids and decode steps from membership."""
    engine = EngineTracer("dp5")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 4)
    summary = engine.tracker.finished("a", "length")
    assert (0, 3, 3) == (summary["first_step"], summary["last_step"], summary["decode_steps"])
    (request,) = captured.named(semconv.SPAN_REQUEST)
    assert {semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= {
        s.name for s in captured.spans() if s.parent is not None and s.parent.span_id == request.context.span_id}


class _RecordedEnergy:
    """Test double for the GPU sampler (no GPU here): 100 W constant, so energy = 100 J/s × duration."""

    available = True

    def energy_j(self, start_ns: int, end_ns: int) -> float:
        return 100.0 * (end_ns - start_ns) / 1e9

    def span_attributes(self, start_ns: int, end_ns: int) -> dict[str, object]:
        return {}


def test_step_energy_is_split_by_token_share(captured: Captured, monkeypatch: object) -> None:
    """Two requests prefilling 30 and 10 tokens share a step's energy 3:1; later steps 1:1;
    the shares sum to the steps' energy."""
    from llmtrace import _gpu_hook

    monkeypatch.setattr(_gpu_hook, "_sampler", _RecordedEnergy)  # type: ignore[attr-defined]
    engine = EngineTracer("dp6")
    engine.tracker.add("big", prompt_tokens=30)
    engine.tracker.add("small", prompt_tokens=10)
    _run_steps(engine, ["big", "small"], 3)
    steps = engine.tracker._open["big"].step_records
    energies = [100.0 * (s.end_ns - s.start_ns) / 1e9 for s in steps]
    big = engine.tracker.finished("big")["energy_j"]
    small = engine.tracker.finished("small")["energy_j"]
    assert big == pytest.approx(energies[0] * 0.75 + (energies[1] + energies[2]) / 2)
    assert big + small == pytest.approx(sum(energies))


class _RecordedForwardTimer:
    """Test double for the CUDA-event ForwardTimer (no CUDA here): each forward took 3 ms on the GPU."""

    def __init__(self) -> None:
        self.keys: list[object] = []

    def begin(self, key: object) -> object:
        return key

    def end(self, token: object) -> None:
        self.keys.append(token)

    def resolve_ready(self) -> list[object]:
        from llmtrace.gpu.cuda_timing import ForwardTiming

        done, self.keys = self.keys, []
        return [ForwardTiming(key, 0, 0.003, 1_000, 3_001_000) for key in done]


def test_forward_spans_carry_cuda_event_gpu_time(captured: Captured) -> None:
    """With a forward timer (CUDA in use), llm.forward gets llm.forward.gpu_time_s and GPU start/end."""
    engine = EngineTracer("dp7")
    engine.forward_timer = _RecordedForwardTimer()
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 2)
    engine.flush_window()
    forwards = captured.named(semconv.SPAN_FORWARD)
    assert [0.003, 0.003] == [f.attributes[semconv.LLM_FORWARD_GPU_TIME_S] for f in forwards]
    assert all(f.attributes[semconv.LLM_FORWARD_GPU_END_NS] - f.attributes[semconv.LLM_FORWARD_GPU_START_NS]
               == 3_000_000 for f in forwards)


def test_no_cuda_no_forward_timer(captured: Captured) -> None:
    """On this CPU machine torch never initialised CUDA: no timer, no GPU-time attribute."""
    engine = EngineTracer("dp8")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 1)
    engine.flush_window()
    assert engine.forward_timer is None
    (forward,) = captured.named(semconv.SPAN_FORWARD)
    assert semconv.LLM_FORWARD_GPU_TIME_S not in forward.attributes


def test_idle_engine_closes_an_old_window(runtime_with: InstallRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """idle() exports a window that has reached its age at once; a younger window stays open.
    The engine's clock is stepped by hand: the window's age is the point, not real time."""
    clock = [time.monotonic_ns()]
    monkeypatch.setattr("llmtrace.lifecycle.engine.monotonic_ns", lambda: clock[0])
    captured = runtime_with(engine_window_s=0.05, engine_window_steps=1000)
    engine = EngineTracer("dp9")
    engine.tracker.add("a")
    _run_steps(engine, ["a"], 2)
    clock[0] += 49_999_999
    engine.idle()
    assert [] == captured.named(semconv.SPAN_ENGINE)
    clock[0] += 1
    engine.idle()
    assert 1 == len(captured.named(semconv.SPAN_ENGINE))


def test_marks_record_the_same_phases_as_with_blocks(captured: Captured) -> None:
    """step.mark(name) boundaries give contiguous phases; end_step closes the last one, and the
    forward marked this way is timed on the GPU like a ``with`` block's."""
    engine = EngineTracer("dp9")
    engine.forward_timer = _RecordedForwardTimer()
    engine.tracker.add("a")
    step = engine.begin_step()
    step.mark("schedule")
    step.batch(["a"], decode_tokens=1)
    step.mark("forward")
    step.mark("sample")
    step.tokens()
    step.mark("postprocess")
    engine.end_step(step)
    assert ["schedule", "forward", "sample", "postprocess"] == [name for name, _, _ in step.phases]
    bounds = [t for _, start, end in step.phases for t in (start, end)]
    assert bounds == sorted(bounds)
    assert all(step.phases[i][2] == step.phases[i + 1][1] for i in range(3))  # contiguous
    assert step.phases[-1][2] <= step.end_ns
    engine.flush_window()
    (forward,) = captured.named(semconv.SPAN_FORWARD)
    assert 0.003 == forward.attributes[semconv.LLM_FORWARD_GPU_TIME_S]
    names = {s.name for s in captured.spans()}
    assert {semconv.SPAN_SCHEDULE, semconv.SPAN_SAMPLE, semconv.SPAN_POSTPROCESS} <= names


def test_mark_none_ends_a_phase_without_starting_another(runtime_with: InstallRuntime) -> None:
    engine = EngineTracer("dp10")
    step = engine.begin_step()
    step.mark("schedule")
    step.mark(None)
    engine.end_step(step)
    assert ["schedule"] == [name for name, _, _ in step.phases]


def test_batch_and_tokens_skip_unknown_and_finished_requests(captured: Captured, caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids the tracker never saw are logged and skipped (also from a generator); a request that
    already finished gets no more steps or tokens; the others are counted."""
    import logging

    from llmtrace import _safety

    monkeypatch.setattr(_safety, "_warned", set())  # the warning is once per process

    engine = EngineTracer("dp11")
    for rid in ("a", "b"):
        engine.tracker.add(rid)
    engine.tracker._open["b"].finished("stop")  # ended elsewhere, still in the tracker
    with caplog.at_level(logging.WARNING, logger="llmtrace"):
        step = engine.begin_step()
        step.batch(rid for rid in ("a", "ghost", "b"))
        step.tokens(rid for rid in ("a", "ghost", "b"))
        engine.end_step(step)
    a, b = engine.tracker._open["a"], engine.tracker._open["b"]
    assert ([0], 1, 1) == (a.steps, len(a.scheduled_ns), len(a.token_ns))
    assert ([], [], []) == (b.steps, b.scheduled_ns, b.token_ns)
    assert [a, b] == step.handles
    assert any("never saw" in r.getMessage() for r in caplog.records)


def test_output_tokens_count_events_and_multi_token_events(runtime_with: InstallRuntime) -> None:
    """One per token event, n for an event of n tokens; the adapter's final count wins."""
    engine = EngineTracer("dp12")
    handle = engine.tracker.add("a")
    _run_steps(engine, ["a"], 3)
    handle.token(4)  # a speculative-decoding step that accepted four tokens
    assert 7 == handle.output_tokens
    handle.output_tokens = 8  # an adapter setting the count directly, as before it was derived
    assert 8 == handle.output_tokens
    handle.finished("length", output_tokens=9)
    assert 9 == handle.output_tokens


def test_a_preempted_request_is_scheduled_again_by_the_next_step(runtime_with: InstallRuntime) -> None:
    """Each queue wait ends at the first step after it, not at later ones."""
    engine = EngineTracer("dp13")
    handle = engine.tracker.add("a")
    _run_steps(engine, ["a"], 2)
    engine.tracker.preempted("a")
    _run_steps(engine, ["a"], 2)
    assert 2 == len(handle.queued_ns) == len(handle.scheduled_ns)
    assert handle.queued_ns[1] <= handle.scheduled_ns[1]
    assert [0, 1, 2, 3] == handle.steps
    assert not handle.awaiting_schedule


def _step(engine: EngineTracer, ids: list[str], tokens: list[str] | None = None, whole: bool = True) -> int:
    step = engine.begin_step()
    step.batch(ids)
    if whole:
        step.tokens()
    elif tokens:
        step.tokens(tokens)
    engine.end_step(step)
    return step.step_id


def test_step_membership_follows_a_changing_batch(runtime_with: InstallRuntime) -> None:
    """Known answers for each request's steps, token events and queue runs while the batch
    changes: requests joining and leaving, a preemption (also one undone within a single
    schedule, the batch unchanged), token events for part of a batch, and a request that
    ended while the engine still lists it."""
    engine = EngineTracer("dp14")
    a, b, c = (engine.tracker.add(rid) for rid in "abc")
    _step(engine, ["a", "b"])                      # 0: a and b start
    _step(engine, ["a", "b"])                      # 1: the same batch
    _step(engine, ["a", "b", "c"])                 # 2: c joins
    _step(engine, ["a", "b", "c"], ["c"], whole=False)  # 3: only c produces a token
    engine.tracker.preempted("b")                  # b waits again, the batch is unchanged
    _step(engine, ["a", "c"])                      # 4
    _step(engine, ["a", "b", "c"])                 # 5: b is back
    assert [0, 1, 2, 3, 4, 5] == a.steps
    assert [0, 1, 2, 3, 5] == b.steps
    assert [2, 3, 4, 5] == c.steps
    assert (5, 4, 4) == (len(a.token_ns), len(b.token_ns), len(c.token_ns))
    assert a.token_ns == sorted(a.token_ns) and b.token_ns[-1] == a.token_ns[-1]
    assert c.token_ns[1] not in a.token_ns  # step 3's token was c's alone
    assert 2 == len(b.scheduled_ns) == len(b.queued_ns)
    a.finished("stop")                             # ended elsewhere: the engine still lists it
    _step(engine, ["a", "b", "c"])                 # 6: the same batch, a's record is closed
    assert [0, 1, 2, 3, 4, 5] == a.steps and 5 == len(a.token_ns) == a.output_tokens
    assert [0, 1, 2, 3, 5, 6] == b.steps and 5 == b.output_tokens
    engine.tracker.preempted("b")                  # preempted and back in one schedule:
    _step(engine, ["a", "b", "c"])                 # 7: the same batch, yet a new run for b
    assert 3 == len(b.scheduled_ns) == len(b.queued_ns) and 7 == b.steps[-1]
    summary = engine.tracker.finished("c", "length")
    assert (2, 7, 5) == (summary["first_step"], summary["last_step"], summary["decode_steps"])


def test_a_second_batch_call_in_one_step_adds_its_requests(runtime_with: InstallRuntime) -> None:
    """batch() twice in a step (e.g. prefills and decodes reported apart): both sets are in
    the step and get its token; the next step has only its own batch."""
    engine = EngineTracer("dp15")
    a, b = engine.tracker.add("a"), engine.tracker.add("b")
    _step(engine, ["a"])
    step = engine.begin_step()
    step.batch(["a"])
    step.batch(["b"])
    step.tokens()
    engine.end_step(step)
    assert [a, b] == step.handles
    assert ([0, 1], [1]) == (a.steps, b.steps)
    assert (2, 1) == (len(a.token_ns), len(b.token_ns))
    _step(engine, ["a"])
    assert [0, 1, 2] == a.steps and 3 == len(a.token_ns)


def test_a_windows_spans_are_the_same_through_the_sdk_and_through_any_tracer(
        runtime_with: InstallRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's fast path (spans built finished, handed over per step) and the tracer-API path a
    vendor tracer gets emit the same window: names, parents, times, attributes and links."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llmtrace._otel.providers import LLMTraceSampler
    from llmtrace.lifecycle import emit
    from llmtrace.lifecycle import engine as engine_module

    runtime_with(engine_window_steps=100)
    engine = EngineTracer("dp0")
    ids = ["r0", "r1"]
    for rid in ids:
        engine.tracker.add(rid)
    _run_steps(engine, ids, 3)
    window, engine._window = engine._window, None  # closed: a collection while building adds no llm.gc to it
    assert window is not None

    def emitted(make: type[emit.SdkFinishedSpans] | type[emit.ApiFinishedSpans]) -> list[tuple[object, ...]]:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=LLMTraceSampler(1.0))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        spans = make(provider.get_tracer("llmtrace"))  # type: ignore[arg-type]
        monkeypatch.setattr(emit, "current", lambda: spans)
        engine_module._build_window("dp0", window)
        finished: list[ReadableSpan] = list(exporter.get_finished_spans())
        names = {s.context.span_id: s.name for s in finished}
        # (The SDK's live span freezes a list value into a tuple; both encode to the same OTLP array.)
        return [(s.name, names.get(s.parent.span_id) if s.parent else None, s.start_time, s.end_time,
                 {k: tuple(v) if isinstance(v, list) else v for k, v in (s.attributes or {}).items()},
                 [(link.context.span_id, dict(link.attributes or {})) for link in s.links])
                for s in finished]

    fast, api = emitted(emit.SdkFinishedSpans), emitted(emit.ApiFinishedSpans)
    # The window, and per step the step, its schedule and its forward (and any llm.gc the collector ran).
    assert 1 + 3 * 3 == len([span for span in fast if span[0] != semconv.SPAN_GC])
    assert api == fast
    for rid in ids:
        engine.tracker.finished(rid)


def test_batch_requests_keeps_request_timelines_without_the_numbers(runtime_with: InstallRuntime) -> None:
    """What an integration records in an unsampled window's step: the requests' first scheduling and
    step ids equal what ``batch()`` records; the batch-size metric still counts the requests."""
    captured = runtime_with(engine_sample_ratio=0.0, sample_ratio=0.0)
    engine = EngineTracer("dp20")
    lean, full = engine.tracker.add("lean"), engine.tracker.add("full")
    for _ in range(3):
        step = engine.begin_step()
        assert not step.sampled
        step.batch_requests(["lean"], preempted=1)
        step.batch(["full"], decode_tokens=1)
        engine.end_step(step)
    engine.flush_window()
    assert lean.steps == full.steps == [0, 1, 2]
    assert lean.scheduled_ns == full.scheduled_ns and not lean.awaiting_schedule
    batch = captured.metrics()[semconv.METRIC_BATCH_SIZE].data.data_points[0]
    assert 3 == batch.count and 6 == batch.sum


def test_a_step_whose_window_turned_over_omits_the_numbers_it_skipped(runtime_with: InstallRuntime) -> None:
    """Overlapping steps (async scheduling): a step begun in an unsampled window whose outputs land
    after that window closed joins the next one; if that one is sampled, the step's span carries
    its requests but no prefill/decode split rather than a false zero. (The sampling draw is set on
    the tracer between windows: no public knob changes it mid-run.)"""
    captured = runtime_with(engine_sample_ratio=0.0, engine_window_steps=1)
    engine = EngineTracer("dp21")
    engine.tracker.add("a")
    first, second = engine.begin_step(), engine.begin_step()  # both in the first, unsampled window
    for step in (first, second):
        assert not step.sampled
        step.batch_requests(["a"])
    engine.end_step(first)  # one step fills the window: it closes, unsampled
    engine._ratio = 1.0
    engine.end_step(second)  # lands in a new window, sampled
    third = engine.begin_step()
    assert third.sampled
    third.batch(["a"], prefill_tokens=0, decode_tokens=1)
    engine.end_step(third)
    engine.flush_window()
    spans = {s.attributes[semconv.LLM_STEP_ID]: s for s in captured.named(semconv.SPAN_STEP)}
    assert [1, 2] == sorted(spans)  # type: ignore[type-var]  # ints: the SDK types them AnyValue
    assert 1 == spans[1].attributes[semconv.LLM_BATCH_SIZE]
    assert semconv.LLM_BATCH_DECODE_TOKENS not in spans[1].attributes
    assert semconv.LLM_BATCH_PREFILL_TOKENS not in spans[1].attributes
    assert 1 == spans[2].attributes[semconv.LLM_BATCH_DECODE_TOKENS]
    assert 0 == spans[2].attributes[semconv.LLM_BATCH_PREFILL_TOKENS]


def test_counted_steps_feed_the_metrics_a_step_record_would(runtime_with: InstallRuntime,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of an unsampled window reported with count_step (no StepRecord) and ones with a record:
    the batch-size histogram counts both alike, the idle ratio is forward time over the window's
    span, the window closes at engine_window_steps counting both kinds, and step ids are one sequence.
    The engine's clock is stepped by hand, so that the idle ratio is exact."""
    base = time.monotonic_ns()
    monkeypatch.setattr("llmtrace.lifecycle.engine.monotonic_ns", lambda: base + 200)  # the record's end
    captured = runtime_with(engine_sample_ratio=0.0, engine_window_steps=4, engine_window_s=3600)
    engine = EngineTracer("dp22")
    assert not engine.needs_step_record(base)
    assert 0 == engine.next_step_id()
    engine.count_step(base, base + 100, batch_size=3, forward_ns=60)
    record = engine.begin_step(base + 100)
    assert 1 == record.step_id and not record.sampled
    record.batch_handles([], size=5)
    record.add_phase("forward", base + 120, base + 160)
    engine.end_step(record)
    assert 2 == engine.next_step_id()
    engine.count_step(base + 200, base + 300, batch_size=1)  # a forward not timed: no busy time
    assert engine._window is not None and 3 == len(engine._window)
    engine.count_step(base + 300, base + 400, batch_size=2, forward_ns=100)  # the fourth step: closes
    assert engine._window is None
    batch = captured.metrics()[semconv.METRIC_BATCH_SIZE].data.data_points[0]
    assert (4, 11) == (batch.count, batch.sum)
    (idle,) = captured.metrics()[semconv.METRIC_GPU_IDLE_RATIO].data.data_points
    assert 1.0 - (60 + 40 + 100) / 400 == pytest.approx(idle.value)
    assert [] == captured.named(semconv.SPAN_STEP)


def test_note_batch_keeps_the_timelines_batch_handles_does(runtime_with: InstallRuntime) -> None:
    """What a counted step keeps of its batch (note_batch) is what a record's batch_handles keeps:
    each open request's first scheduling and step ids; a finished request is left alone."""
    from llmtrace.lifecycle.engine import note_batch

    runtime_with(engine_sample_ratio=0.0, sample_ratio=0.0)
    engine = EngineTracer("dp23")
    counted, recorded, done = engine.tracker.add("counted"), engine.tracker.add("recorded"), engine.tracker.add("done")
    engine.tracker.finished("done")
    for _ in range(3):
        step = engine.begin_step()
        note_batch([counted, done], step.step_id, step.start_ns)
        step.batch_handles([recorded])
        engine.end_step(step)
    assert counted.steps == recorded.steps == [0, 1, 2] and done.steps == []
    assert counted.scheduled_ns == recorded.scheduled_ns and not counted.awaiting_schedule


def test_a_step_needs_a_record_in_a_sampled_window_or_for_per_request_energy(
        runtime_with: InstallRuntime) -> None:
    """needs_step_record: a sampled window's steps become spans; an unsampled window's need a record
    only where GPU energy is split among requests and some request has a record open."""
    runtime_with(engine_sample_ratio=1.0)
    assert EngineTracer("dp24").needs_step_record(0, records_open=False)
    runtime_with(engine_sample_ratio=0.0)
    engine = EngineTracer("dp25")
    assert not engine.needs_step_record(0) and not engine.needs_step_record(0, records_open=False)
    engine.energy_accounting = True
    assert engine.needs_step_record(0) and not engine.needs_step_record(0, records_open=False)


def test_step_energy_counts_the_requests_without_a_record(captured: Captured, monkeypatch: object) -> None:
    """A step whose batch is larger than its records (StepRecord.size): the requests without one
    take one token's share each, so a recorded request in a batch of four decodes gets a quarter."""
    from llmtrace import _gpu_hook

    monkeypatch.setattr(_gpu_hook, "_sampler", _RecordedEnergy)  # type: ignore[attr-defined]
    engine = EngineTracer("dp26")
    handle = engine.tracker.add("kept", prompt_tokens=1)
    step = engine.begin_step()
    step.batch_handles([handle], size=4)
    engine.end_step(step)
    energy = 100.0 * (step.end_ns - step.start_ns) / 1e9
    assert energy / 4 == pytest.approx(engine.tracker.finished("kept")["energy_j"])
