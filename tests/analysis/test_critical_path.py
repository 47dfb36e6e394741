"""Critical path: Jaeger's walk-back algorithm with clipping, on traces with known answers."""

from __future__ import annotations

import random

import pytest

from llmtrace.analysis import analyze, build_traceset
from llmtrace.analysis._kernels import KERNELS, PYTHON
from llmtrace.analysis.critical_path import aggregate, critical_path, exclusive_by_name
from llmtrace.analysis.model import Link, Span, SpanKind, Trace
from tests.analysis.builders import T0, request_trace, span


def _path(trace: Trace, root_name: str = "root", **kw: int) -> list[tuple[str, float, float]]:
    root = next(s for s in trace.spans if s.name == root_name)
    return [
        (s.span.name, (s.start_ns - T0) / 1e6, (s.end_ns - T0) / 1e6)
        for s in critical_path(trace, root, **kw)
    ]


def test_overlapping_children_take_the_last_finisher_and_skip_the_overlapped_one() -> None:
    """b overlaps c (ends after c starts), so b is off the path; a ends before c starts, so it is on it."""
    root = span("root", 0, 180)
    spans = [
        root,
        span("a", 10, 40, parent=root),
        span("b", 45, 120, parent=root),
        span("c", 80, 170, parent=root),
    ]
    expected = [("root", 170, 180), ("c", 80, 170), ("root", 40, 80), ("a", 10, 40), ("root", 0, 10)]
    assert expected == _path(Trace.build(root.trace_id, spans))


def test_sequential_phases_that_touch_are_all_on_the_path() -> None:
    """Phases ending exactly when the next begins are all on the path (Jaeger's `<` would skip them)."""
    spans = request_trace("a" * 32, 0, 1, 2, 3, 4)
    trace = Trace.build("a" * 32, spans)
    names = [n for n, _, _ in _path(trace, "llm.request")]
    assert ["llm.decode", "llm.prefill", "llm.queue", "llm.tokenize"] == names


def test_children_are_clipped_to_the_parent() -> None:
    """A child outliving its parent only counts inside the parent; one entirely outside is dropped."""
    root = span("root", 0, 100)
    spans = [root, span("late", 60, 130, parent=root), span("outside", 150, 160, parent=root)]
    assert [("late", 60, 100), ("root", 0, 60)] == _path(Trace.build(root.trace_id, spans))


def test_grandchildren_are_clipped_to_the_clipped_child() -> None:
    """Clipping applies recursively: a grandchild cannot extend past its clipped parent."""
    root = span("root", 0, 100)
    child = span("child", 50, 150, parent=root)
    spans = [root, child, span("grandchild", 90, 140, parent=child)]
    assert _path(Trace.build(root.trace_id, spans)) == [
        ("grandchild", 90, 100),
        ("child", 50, 90),
        ("root", 0, 50),
    ]


def test_sections_tile_the_root_exactly() -> None:
    """The exclusive times on the path sum to the root's duration."""
    root = span("root", 0, 500)
    spans = [
        root,
        span("x", 0, 200, parent=root),
        span("y", 150, 300, parent=root),
        span("z", 320, 480, parent=root),
    ]
    trace = Trace.build(root.trace_id, spans)
    assert root.duration_ns == sum(s.duration_ns for s in critical_path(trace, root))


def test_orphan_with_missing_parent_becomes_a_root_and_has_its_own_path() -> None:
    """A span whose parent is not in the data is a root, reported as an orphan, and still analysable."""
    orphan = span("orphan", 0, 10, parent_id="f" * 16)
    kid = span("kid", 2, 8, parent=orphan)
    trace = Trace.build(orphan.trace_id, [orphan, kid])
    assert (orphan,) == trace.orphans
    assert [("orphan", 8, 10), ("kid", 2, 8), ("orphan", 0, 2)] == _path(trace, "orphan")


def test_follows_from_links_never_extend_the_path() -> None:
    """A linked (follows-from) span is not a child: it is not on the root's critical path."""
    root = span("root", 0, 10)
    linked = span("async", 5, 50, links=(Link(root.trace_id, root.span_id),))
    trace = Trace.build(root.trace_id, [root, linked])
    assert [("root", 0, 10)] == _path(trace)


def test_overlap_allowance_keeps_a_slightly_overlapping_child_cut_at_the_overlap() -> None:
    """With a 5 ms allowance, b (overlapping c by 2 ms) is on the path up to c's start."""
    root = span("root", 0, 100)
    spans = [root, span("b", 10, 52, parent=root), span("c", 50, 100, parent=root)]
    trace = Trace.build(root.trace_id, spans)
    assert [("c", 50, 100), ("b", 10, 50), ("root", 0, 10)] == _path(trace, overlap_allowance_ns=5_000_000)
    assert [("c", 50, 100), ("root", 0, 50)] == _path(trace)


def test_zero_length_children_terminate() -> None:
    """Zero-duration children at the same instant do not loop forever and own no time."""
    root = span("root", 0, 10)
    spans = [root, span("z1", 5, 5, parent=root), span("z2", 5, 5, parent=root)]
    assert [("root", 5, 10), ("root", 0, 5)] == _path(Trace.build(root.trace_id, spans))


def _cycle() -> list[Span]:
    """A SERVER span whose parent id names its own child, the request (corrupt data)."""
    server_id, request_id = "1" * 16, "2" * 16
    server = span("POST", 0, 10, span_id=server_id, parent_id=request_id, kind=SpanKind.SERVER)
    request = span("llm.request", 1, 9, span_id=request_id, parent_id=server_id)
    return [server, request, span("llm.decode", 2, 8, parent=request)]


def test_a_parent_cycle_ends_the_walk() -> None:
    """Found by fuzzing: the walk re-entered the server under its own child without end,
    until the machine ran out of memory. A span already on the path is not entered again."""
    spans = _cycle()
    path = _path(Trace.build(spans[0].trace_id, spans), "POST")
    assert [("POST", 9, 10), ("llm.request", 8, 9), ("llm.decode", 2, 8), ("llm.request", 1, 2), ("POST", 0, 1)] == path


def test_a_request_in_a_parent_cycle_is_analysed() -> None:
    """The whole analysis of such a trace finishes, with the request and its latency."""
    summary = analyze(build_traceset(_cycle()))
    assert summary.requests["count"] == 1
    assert [s.name for s in summary.critical_path] == ["llm.decode", "POST", "llm.request"]  # ties by name


def test_aggregate_shares_sum_to_one_and_percentiles_are_per_name() -> None:
    """CRISP aggregation: per-name share of total latency; shares add up to 1."""
    traces = [Trace.build(t, request_trace(t, 0, 1, q, 3, 6)) for t, q in (("a" * 32, 0), ("b" * 32, 10))]
    paths = []
    for tr in traces:
        root = next(s for s in tr.spans if s.name == "llm.request")
        paths.append((root.duration_ns, critical_path(tr, root)))
    stats, folded = aggregate(paths)
    by = {s.name: s for s in stats}
    assert 1.0 == round(sum(s.share for s in stats), 9)
    assert 12 / 30 == round(by["llm.decode"].share, 9)
    assert 1 == by["llm.queue"].requests
    assert ("llm.request", "llm.decode") in folded
    assert exclusive_by_name(paths[0][1]) == {
        "llm.decode": 6_000_000,
        "llm.prefill": 3_000_000,
        "llm.tokenize": 1_000_000,
    }


def _random_tree(rng: random.Random) -> tuple[Trace, Span]:
    """A random tree: overlapping, touching, zero-length and outliving children, ties in
    start and end, and sometimes a parent cycle back to the root."""
    root = span("root", 0, rng.choice([10, 50, 100]), trace="r" * 32)
    spans = [root]
    for _ in range(rng.randint(0, 25)):
        parent = rng.choice(spans)
        a = rng.choice([rng.uniform(-10, 110), parent.start_ns / 1e6 - T0 / 1e6, rng.randint(0, 100)])
        b = a + rng.choice([0.0, rng.uniform(0, 40), rng.randint(0, 30)])
        spans.append(span(rng.choice(["a", "b", "c"]), a, b, parent=parent))
    if rng.random() < 0.1 and len(spans) > 1:  # the root names one of its descendants as parent
        spans[0] = root = root._replace(parent_id=rng.choice(spans[1:]).span_id)
    trace = Trace.build("r" * 32, spans)
    return trace, root


def test_compiled_walk_and_python_walk_agree_on_random_trees() -> None:
    """native/src/critical_path.rs against the Python oracle: same sections, same objects."""
    if not KERNELS.compiled:
        pytest.skip("llmtrace-native not built (needs cargo: pip install ./native)")
    rng = random.Random(5)
    for _ in range(3000):
        trace, root = _random_tree(rng)
        allowance = rng.choice([0, 0, 1_000_000, 5_000_000])
        python = PYTHON.critical_path(trace.children, root, allowance)
        compiled = critical_path(trace, root, overlap_allowance_ns=allowance)
        assert compiled == python
        assert [s.span for s in compiled] == [s.span for s in python]


def test_compiled_path_totals_and_python_aggregation_agree_on_random_requests() -> None:
    """native/src/critical_path.rs's ``path_totals`` against the Python oracle: the same
    per-name totals, folded stacks (in the same order: the flame view keeps first-seen order
    among ties) and dominant segments, with and without a first token, over random request
    trees."""
    from llmtrace import semconv as sc
    from llmtrace.analysis.critical_path import path_items
    from llmtrace.analysis.model import RequestView

    if not KERNELS.compiled:
        pytest.skip("llmtrace-native not built (needs cargo: pip install ./native)")
    rng = random.Random(9)
    for _ in range(150):
        requests = []
        for _ in range(rng.randint(0, 12)):
            trace, root = _random_tree(rng)
            ttft = rng.choice([None, rng.uniform(0, 0.12), 0.0])
            attrs = {} if ttft is None else {sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: ttft}
            request = root._replace(attributes=attrs)
            trace = Trace.build(trace.trace_id, [request if s is root else s for s in trace.spans])
            requests.append(RequestView.of(trace, request, None, {}))
        allowance = rng.choice([0, 1_000_000])
        compiled = KERNELS.path_totals(path_items(requests), allowance)
        python = PYTHON.path_totals(path_items(requests), allowance)
        assert compiled == python
        assert list(compiled.totals) == list(python.totals)
        assert list(compiled.folded) == list(python.folded)
        assert list(compiled.dominant) == list(python.dominant)


@pytest.mark.parametrize("ttft", [9e299, -9e299, 1e18])
def test_an_absurd_first_token_latency_is_analysed_not_overflowed(ttft: float) -> None:
    """A finite but absurd ``time_to_first_token`` (9e299 s is a finite number, but not in
    nanoseconds) once overflowed the analysis to infinity; now the whole path (or none of it)
    is before the first token, and the summary is made."""
    from llmtrace import semconv as sc

    spans = request_trace("a" * 32, 0, 1, 2, 3, 4, attrs={sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: ttft})
    summary = analyze(build_traceset(spans))
    assert summary.requests["count"] == 1 and summary.requests["ttft_s"]["p50"] == ttft
