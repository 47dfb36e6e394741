"""GPU idle gaps: known idle ratios, cause classification, work-waiting split, sampling.

Every test runs twice: against the Python kernels (``_oracle.classify_gaps``, the reference)
and against the compiled ones in llmtrace-native (skipped, saying so, where it is not
built); test_gpu_idle_compiled.py compares the two on random engines.
"""

from __future__ import annotations

import random

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import gpu_idle
from llmtrace.analysis._kernels import KERNELS, PYTHON
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.gpu_idle import engine_idle
from llmtrace.analysis.model import Span
from tests.analysis.builders import T0, engine_window, random_engine, request_trace, span


@pytest.fixture(autouse=True, params=["python", "compiled"])
def sweeps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "compiled" and not KERNELS.compiled:
        pytest.skip("llmtrace-native not built (needs cargo: pip install ./native)")
    monkeypatch.setattr(gpu_idle, "KERNELS", KERNELS if request.param == "compiled" else PYTHON)
    return str(request.param)

# Each step: 1 ms schedule, 8 ms forward, 1 ms postprocess, back to back -> 20% idle.
STEPS = [(10.0 * i, 10.0 * i + 1, 10.0 * i + 9, 10.0 * i + 10) for i in range(10)]


def _idle(spans: list[Span], engine: str = "dp0"):  # type: ignore[no-untyped-def]
    ts = build_traceset(spans)
    return engine_idle(ts.engines[engine], ts.requests, ts.tokenize)


def test_engine_with_known_idle_ratio() -> None:
    """10 steps of 10 ms with 8 ms forwards: idle ratio 0.2 in 11 gaps (9 post+schedule pairs, 2 ends)."""
    e = _idle(engine_window("dp0", STEPS))
    assert 100_000_000 == e.covered_ns
    assert pytest.approx(0.2) == e.ratio
    assert 11 == e.gap_count  # postprocess of step i and schedule of step i+1 form one gap
    assert 10_000_000 == e.by_cause_ns["schedule"]
    assert 10_000_000 == e.by_cause_ns["postprocess"]
    assert 0 == e.by_cause_ns["other"]


def test_gc_pause_takes_priority_over_other_host_work() -> None:
    """A gc pause overlapping a postprocess span is counted as gc."""
    spans = engine_window("dp0", STEPS, gc=[(9.0, 10.0)])
    e = _idle(spans)
    assert 1_000_000 == e.by_cause_ns["gc"]
    assert 9_000_000 == e.by_cause_ns["postprocess"]


def test_untraced_time_between_steps_is_other() -> None:
    """Time between a step's end and the next step's start that no host span covers is 'other'."""
    steps = [(0.0, 1.0, 9.0, 10.0), (15.0, 16.0, 24.0, 25.0)]
    e = _idle(engine_window("dp0", steps))
    assert 5_000_000 == e.by_cause_ns["other"]
    assert pytest.approx(9 / 25) == e.ratio


def test_idle_split_into_work_waiting_and_nothing_to_do() -> None:
    """With request traces present, only the part of a gap with a request in flight is 'with work waiting'."""
    steps = [(0.0, 1.0, 9.0, 10.0), (50.0, 51.0, 59.0, 60.0)]
    window = engine_window("dp0", steps, step_attrs={sc.LLM_QUEUE_RUNNING: 0, sc.LLM_BATCH_SIZE: 0})
    req = request_trace("r" * 32, 30.0, 0, 20.0, 9.0, 1.0)  # in flight 30..60 ms
    e = _idle(window + req)
    # idle: 0-1, 9-51 (42), 59-60 -> 44 ms; the request covers 30-51 and 59-60 -> 22 ms
    assert 44_000_000 == e.idle_ns
    assert 22_000_000 == e.with_work_waiting_ns
    assert 22_000_000 == e.nothing_to_do_ns


def test_work_waiting_upstream_of_the_engine_is_split_out() -> None:
    """A request tokenized for 25 ms before the engine queued it: while it was upstream the engine
    was idle with its own queue empty; from its llm.queue on, the engine held it."""
    steps = [(0.0, 1.0, 9.0, 10.0), (50.0, 51.0, 59.0, 60.0)]
    window = engine_window("dp0", steps, step_attrs={sc.LLM_QUEUE_RUNNING: 0, sc.LLM_BATCH_SIZE: 0})
    req = request_trace("u" * 32, 20.0, 25.0, 5.0, 9.0, 1.0)  # in flight 20..60, engine from 45
    e = _idle(window + req)
    # idle 0-1, 9-51, 59-60; with work 20-51 and 59-60 (32 ms); engine-held 45-51 and 59-60 (7 ms)
    assert 32_000_000 == e.with_work_waiting_ns
    assert 25_000_000 == e.upstream_ns


def test_no_upstream_claim_without_engine_phases() -> None:
    """A request without phase spans says nothing about where it waited: none of it is upstream."""
    steps = [(0.0, 1.0, 9.0, 10.0), (50.0, 51.0, 59.0, 60.0)]
    window = engine_window("dp0", steps, step_attrs={sc.LLM_QUEUE_RUNNING: 0, sc.LLM_BATCH_SIZE: 0})
    req = [s for s in request_trace("v" * 32, 20.0, 0, 30.0, 9.0, 1.0) if s.name == sc.SPAN_REQUEST]
    e = _idle(window + req)
    assert 32_000_000 == e.with_work_waiting_ns
    assert 0 == e.upstream_ns


def test_a_lone_request_finishing_then_another_arriving_leaves_a_quiet_gap() -> None:
    """One request runs in step 0 and finishes; the next arrives and runs in step 1, 40 ms later.
    Both steps say running=1, but no request stayed in the engine across the gap: with no
    request traces saying otherwise, the gap is 'nothing to do' (a quiet server, not lost
    throughput). The same request on both sides makes it 'with work waiting'."""
    steps = [(0.0, 1.0, 9.0, 10.0), (50.0, 51.0, 59.0, 60.0)]
    two = engine_window("dp0", steps, per_step_attrs=[{sc.LLM_BATCH_REQUEST_IDS: ["a"]},
                                                      {sc.LLM_BATCH_REQUEST_IDS: ["b"]}])
    e = _idle(two)
    assert 44_000_000 == e.idle_ns
    assert 4_000_000 == e.with_work_waiting_ns  # only the idle inside the two (non-empty) steps
    assert 40_000_000 == e.nothing_to_do_ns
    same = engine_window("dp0", steps, per_step_attrs=[{sc.LLM_BATCH_REQUEST_IDS: ["a"]},
                                                       {sc.LLM_BATCH_REQUEST_IDS: ["a"]}])
    assert 44_000_000 == _idle(same).with_work_waiting_ns  # the 10-50 ms stretch too


def test_step_attributes_mark_work_waiting_without_request_traces() -> None:
    """Requests sampled out: a step leaving requests waiting makes the following gap 'with work'."""
    steps = [(0.0, 1.0, 9.0, 10.0), (20.0, 21.0, 29.0, 30.0)]
    window = engine_window("dp0", steps, step_attrs={sc.LLM_QUEUE_WAITING: 3})
    e = _idle(window)
    assert e.idle_ns == e.with_work_waiting_ns


def test_unsampled_stretch_between_windows_is_not_measured() -> None:
    """Two windows whose step ids are not consecutive: the time between them is not idle time."""
    w1 = engine_window("dp0", STEPS[:3], first_step_id=0)
    later = [(a + 1000, b + 1000, c + 1000, d + 1000) for a, b, c, d in STEPS[:3]]
    w2 = engine_window("dp0", later, first_step_id=500)
    e = _idle(w1 + w2)
    assert 60_000_000 == e.covered_ns
    assert pytest.approx(0.2) == e.ratio


def test_consecutive_windows_are_joined() -> None:
    """Windows with consecutive step ids are one timeline: the gap across the boundary counts."""
    w1 = engine_window("dp0", [(0.0, 1.0, 9.0, 10.0)], first_step_id=0)
    w2 = engine_window("dp0", [(30.0, 31.0, 39.0, 40.0)], first_step_id=1)
    e = _idle(w1 + w2)
    assert 40_000_000 == e.covered_ns
    assert 24_000_000 == e.idle_ns


def test_engines_are_measured_separately() -> None:
    """Each llm.engine.id has its own timeline; one engine's forwards do not hide another's gaps."""
    a = engine_window("dp0", STEPS)
    b = engine_window("dp1", [(0.0, 5.0, 6.0, 10.0)])
    ts = build_traceset(a + b)
    assert {"dp0", "dp1"} == set(ts.engines)
    assert pytest.approx(0.9) == engine_idle(ts.engines["dp1"], (), ()).ratio


def test_tokenize_overlapping_a_gap_is_classified_as_tokenize() -> None:
    """A tokenizer span during an otherwise untraced gap is the gap's cause."""
    steps = [(0.0, 1.0, 9.0, 10.0), (20.0, 21.0, 29.0, 30.0)]
    tok = span(sc.SPAN_TOKENIZE, 12.0, 18.0, trace="k" * 32)
    e = _idle([*engine_window("dp0", steps), tok])
    assert 6_000_000 == e.by_cause_ns["tokenize"]
    assert 4_000_000 == e.by_cause_ns["other"]
    assert e.top_gaps[0].start_ns > T0



@pytest.mark.parametrize("seed", range(40))
def test_gap_accounting_adds_up_on_random_engines(seed: int) -> None:
    """Invariants on random engines: each gap's causes sum to its length, its work waiting
    fits in it, it lies in an analysed segment; the totals nest (upstream <= with work <=
    idle <= covered) and the causes add up to the idle time."""
    ts = build_traceset(random_engine(random.Random(seed)))
    e = engine_idle(ts.engines["dp0"], ts.requests, ts.tokenize)
    for g in e.gaps:
        assert sum(ns for _, ns in g.causes) == g.duration_ns and all(ns > 0 for _, ns in g.causes)
        assert 0 <= g.work_waiting_ns <= g.duration_ns
        assert any(a <= g.start_ns and g.end_ns <= b for a, b in e.segments)
    assert sum(e.by_cause_ns.values()) == e.idle_ns
    assert 0 <= e.upstream_ns <= e.with_work_waiting_ns <= e.idle_ns <= e.covered_ns
