"""The compiled counter of an engine's unsampled windows' steps (native/src/step_counter.rs) and the
EngineTracer side of it (``attach_counter``, ``allow_counter``, ``settle_counter``).

The counter is a generic lifecycle piece: it is handed plain objects here — a step's key object with
a batch attribute, an engine object with a "busy" attribute — exactly the shapes it reads of vLLM's
``SchedulerOutput`` and ``Scheduler`` (tests/vllm/test_e2e_offline.py runs it under the real ones).
Clocks are given by hand, so that the totals are exact."""

from __future__ import annotations

import time
from typing import Any

import pytest

from llmtrace import EngineTracer, semconv
from llmtrace._native import load
from tests.core.conftest import InstallRuntime

NATIVE = load()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmtrace-native not built: no compiled step counter")


class _Engine:
    """An engine as the counter sees it: weakly referenceable, ``requests`` empty once idle."""

    def __init__(self) -> None:
        self.requests: dict[str, object] = {"r": object()}


class _Step:
    """A step's key object: ``batch`` holds its requests."""

    def __init__(self, size: int) -> None:
        self.batch = list(range(size))


def _counter(records: dict[str, Any] | None = None, max_pending: int = 4) -> Any:
    assert NATIVE is not None
    return NATIVE.StepCounter({} if records is None else records, "batch", "requests", max_pending)


def test_it_takes_only_the_steps_it_was_let_into() -> None:
    """Declined: before allow(), past the window's deadline, beyond its steps, another engine's step,
    any step while a request record is open, a step whose batch it cannot read, any step after stop()."""
    records: dict[str, Any] = {}
    counter, engine, other = _counter(records), _Engine(), _Engine()
    assert not counter.scheduled(engine, _Step(1), 0, 1)
    counter.allow(engine, 1_000, 2)
    assert not counter.scheduled(engine, _Step(1), 1_000, 1_001)  # begins at the deadline
    assert not counter.scheduled(other, _Step(1), 10, 11)
    records["r"] = object()
    assert not counter.scheduled(engine, _Step(1), 10, 11)
    del records["r"]
    assert counter.scheduled(engine, _Step(1), 10, 11) and counter.scheduled(engine, _Step(1), 20, 21)
    assert not counter.scheduled(engine, _Step(1), 30, 31)  # its two steps taken
    counter.allow(engine, 1_000, 5)
    assert not counter.scheduled(engine, object(), 40, 41)  # no batch to read: the caller's to handle
    counter.stop()
    assert not counter.scheduled(engine, _Step(1), 40, 41)
    assert 2 == counter.pending()


def test_counted_steps_add_up_as_count_step_would() -> None:
    """Batch sizes in order; forward time from the first dispatch (or the schedule's end when none was
    seen) to the outputs' return; the first step's start and the last one's end; drained once."""
    counter, engine = _counter(), _Engine()
    counter.allow(engine, 10_000, 10)
    first, second = _Step(3), _Step(0)
    assert counter.scheduled(engine, first, 100, 110) and counter.scheduled(engine, second, 200, 205)
    assert counter.dispatched(first, 120) and counter.dispatched(first, 150)  # the first dispatch counts
    assert not counter.dispatched(_Step(1), 130)  # not a step of the counter's
    assert False is counter.updated(engine, first, 180, 190)
    assert False is counter.updated(engine, second, 260, 270)
    assert None is counter.updated(engine, second, 300, 310)  # counted already
    assert ([3, 0], (180 - 120) + (260 - 205), True, 100, 270) == counter.drain()
    assert None is counter.drain()
    assert 2 == counter.counted()


def test_updated_asks_to_settle_when_python_has_work_left() -> None:
    """True (settle: drain into the window, maybe close it) when the window's deadline or step count is
    reached, when a request record opened meanwhile, and when the engine has no request left."""
    records: dict[str, Any] = {}
    counter, engine = _counter(records), _Engine()
    counter.allow(engine, 1_000, 10)
    for start, prepare, settle in ((10, lambda: None, False), (20, lambda: records.update(r=1), True),
                                   (30, engine.requests.clear, True)):
        step = _Step(1)
        assert counter.scheduled(engine, step, start, start + 1)
        prepare()
        assert settle is counter.updated(engine, step, start + 2, start + 3)
        records.clear()
        engine.requests["r"] = object()
    step = _Step(1)
    assert counter.scheduled(engine, step, 40, 41)
    assert True is counter.updated(engine, step, 990, 1_000)  # ends at the deadline
    counter.allow(engine, 10_000, 1)
    step = _Step(1)
    assert counter.scheduled(engine, step, 1_100, 1_101)
    assert True is counter.updated(engine, step, 1_102, 1_103)  # the window's last step
    assert 5 == counter.counted()


def test_pending_steps_are_bounded() -> None:
    """A step whose outputs never come back is not held forever: beyond max_pending the oldest goes."""
    counter, engine = _counter(max_pending=2), _Engine()
    counter.allow(engine, 10_000, 10)
    steps = [_Step(1) for _ in range(3)]
    for index, step in enumerate(steps):
        assert counter.scheduled(engine, step, index, index + 1)
    assert 2 == counter.pending()
    assert None is counter.updated(engine, steps[0], 10, 11)
    assert False is counter.updated(engine, steps[2], 10, 11)


def _drive(engine: EngineTracer, owner: _Engine, steps: list[tuple[int, int, int, int, int]]) -> None:
    """Steps (start, schedule end, dispatch, outputs back, end) through the counter, as the vLLM
    hooks hand them: a step the counter declines is counted by the tracer itself."""
    counter = engine.counter
    for start, scheduled, dispatched, back, end in steps:
        key = _Step(2)
        if counter.scheduled(owner, key, start, scheduled):
            counter.dispatched(key, dispatched)
            if counter.updated(owner, key, back, end):
                engine.settle_counter()
        else:
            engine.settle_counter()
            assert not engine.needs_step_record(start, records_open=False)
            engine.next_step_id()
            engine.count_step(start, end, 2, back - dispatched)
            engine.allow_counter(owner, begun=0)


def test_a_window_of_counted_steps_has_the_totals_of_count_step(runtime_with: InstallRuntime) -> None:
    """The same steps through the compiled counter and through count_step alone: the same window
    totals (batch sizes, forward time, span), the same step ids after, and the window closes at
    engine_window_steps either way — with its last step counted where it was begun."""
    runtime_with(engine_sample_ratio=0.0, engine_window_steps=5, engine_window_s=3600)
    base = time.monotonic_ns()
    steps = [(base + 100 * i, base + 100 * i + 10, base + 100 * i + 20, base + 100 * i + 60, base + 100 * i + 70)
             for i in range(4)]
    compiled, reference, owner = EngineTracer("dp40"), EngineTracer("dp41"), _Engine()
    assert compiled.attach_counter({}, "batch", "requests") is compiled.counter is not None
    _drive(compiled, owner, steps)
    for start, _scheduled, dispatched, back, end in steps:
        reference.next_step_id()
        reference.count_step(start, end, 2, back - dispatched)
    compiled.settle_counter()
    assert compiled._window is not None and reference._window is not None
    assert reference._window.totals() == compiled._window.totals()
    assert reference.next_step_id() == compiled.next_step_id()
    _drive(compiled, owner, [(base + 500, base + 510, base + 520, base + 560, base + 570)])  # the fifth: closes
    assert compiled._window is None


def test_flush_window_stops_the_counter_and_keeps_its_steps(runtime_with: InstallRuntime) -> None:
    """A window flushed (shutdown, an idle engine) takes the counted steps with it into the metrics,
    and the counter takes no step of the next window until the tracer lets it."""
    captured = runtime_with(engine_sample_ratio=0.0, engine_window_s=3600)
    engine, owner = EngineTracer("dp42"), _Engine()
    counter = engine.attach_counter({}, "batch", "requests")
    base = time.monotonic_ns()
    assert not engine.needs_step_record(base, records_open=False)
    engine.allow_counter(owner, begun=0)
    step = _Step(3)
    assert counter.scheduled(owner, step, base, base + 10)
    assert False is counter.updated(owner, step, base + 50, base + 60)
    engine.flush_window()
    assert not counter.scheduled(owner, _Step(1), base + 100, base + 110)
    batch = captured.metrics()[semconv.METRIC_BATCH_SIZE].data.data_points[0]
    assert (1, 3) == (batch.count, batch.sum)


def test_the_python_reference_is_one_variable_away(monkeypatch: pytest.MonkeyPatch,
                                                   runtime_with: InstallRuntime) -> None:
    """LLMTRACE_STEP_COUNTER=python: no counter, and the hooks count every step in Python."""
    runtime_with()
    monkeypatch.setenv("LLMTRACE_STEP_COUNTER", "python")
    engine = EngineTracer("dp43")
    assert engine.attach_counter({}, "batch", "requests") is None and engine.counter is None
    engine.allow_counter(_Engine())  # nothing to let in
    engine.settle_counter()
