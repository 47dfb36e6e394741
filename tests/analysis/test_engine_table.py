"""The compiled engine table (native/src/table.rs, analysis/engine_table.py) against the
Python path: the same spans read both ways give the same trace set and the same analysis,
to the last digit; where the table cannot build exactly, it must decline and the Python
path must run on every span, in the original read order."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis._kernels import KERNELS, PYTHON
from llmtrace.analysis._steps import GapInputs
from llmtrace.analysis.intervals import merge
from llmtrace.analysis.model import GAP_CAUSES, Link, Span, TraceSet
from llmtrace.analysis.sources import load_spans, new_engine_table
from llmtrace.analysis.synthetic import SimConfig, write_jsonl
from tests.analysis.builders import engine_window, random_engine, request_trace, span

pytestmark = pytest.mark.skipif(
    new_engine_table() is None, reason="llmtrace-native not built (needs cargo: pip install ./native)"
)


def _value(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, tuple | list):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": v}


def _otlp(s: Span) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": s.trace_id,
        "spanId": s.span_id,
        "name": s.name,
        "kind": int(s.kind),
        "startTimeUnixNano": str(s.start_ns),
        "endTimeUnixNano": str(s.end_ns),
        "attributes": [{"key": k, "value": _value(v)} for k, v in s.attributes.items()],
        "links": [{"traceId": ln.trace_id, "spanId": ln.span_id} for ln in s.links],
    }
    if s.parent_id is not None:
        out["parentSpanId"] = s.parent_id
    return out


def write_spans(path: Path, spans: list[Span], rng: random.Random | None = None) -> None:
    """``spans`` as OTLP/JSON lines, cut into lines of random length, one resource per
    run of spans from the same process."""
    rng = rng or random.Random(0)
    lines = []
    i = 0
    while i < len(spans):
        chunk = spans[i : i + rng.randint(1, 12)]
        i += len(chunk)
        resource_spans: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        for s in chunk:
            res = {"service.name": s.service, **s.resource}
            if not resource_spans or resource_spans[-1][0] != res:
                resource_spans.append((res, []))
            resource_spans[-1][1].append(_otlp(s))
        doc = {
            "resourceSpans": [
                {
                    "resource": {"attributes": [{"key": k, "value": _value(v)} for k, v in res.items()]},
                    "scopeSpans": [{"spans": group}],
                }
                for res, group in resource_spans
            ]
        }
        lines.append(json.dumps(doc))
    path.write_text("\n".join(lines) + "\n")


def read_both(path: Path, **kwargs: Any) -> tuple[TraceSet, TraceSet]:
    """The trace set read with the table and without it."""
    table = new_engine_table()
    loaded = load_spans(str(path), table=table, **kwargs)
    compiled = build_traceset(loaded.spans, warnings=loaded.warnings, table=table)
    plain = load_spans(str(path), **kwargs)
    return compiled, build_traceset(plain.spans, warnings=plain.warnings)


def assert_same(compiled: TraceSet, plain: TraceSet) -> None:
    assert compiled.span_count == plain.span_count
    assert len(compiled.traces) == len(plain.traces)
    assert sorted(compiled.traces, key=lambda t: t.trace_id) == sorted(plain.traces, key=lambda t: t.trace_id)
    assert compiled.warnings == plain.warnings
    assert compiled.requests == plain.requests
    assert list(compiled.engines) == list(plain.engines)
    for eid, e in compiled.engines.items():
        p = plain.engines[eid]
        assert e.windows == p.windows
        assert e.gc == p.gc
        assert len(e.steps) == len(p.steps)
        assert tuple(e.steps) == p.steps
    a, b = analyze(compiled), analyze(plain)
    for ci, pi in zip(a.idle, b.idle, strict=True):  # the gaps the table keeps, made on demand
        assert tuple(ci.gaps) == tuple(pi.gaps)
        assert (ci.worst, ci.windows, ci.top_gaps) == (pi.worst, pi.windows, pi.top_gaps)
    assert to_json(a) == to_json(b)


def _compiled(ts: TraceSet) -> bool:
    return bool(ts.engines) and all(e.compiled is not None for e in ts.engines.values())


def test_simulated_server_reads_compiled_and_analyses_the_same(tmp_path: Path) -> None:
    path = tmp_path / "sim.jsonl"
    write_jsonl(str(path), SimConfig(duration_s=6, arrival_rate=30, seed=3))
    compiled, plain = read_both(path)
    assert _compiled(compiled) and not _compiled(plain)
    assert_same(compiled, plain)


def _busy_engine(rng: random.Random) -> list[Span]:
    """Steps with ids, running/waiting counts, preemptions, kv usage, links to a pool of
    requests and (sometimes) request-id arrays of mixed types: every branch of the step
    evidence and step statistics."""
    n = rng.randint(3, 40)
    steps = []
    t = 0.0
    for _ in range(n):
        a = t + rng.choice([0.0, rng.uniform(0, 3)])
        steps.append((a, a + 0.2, a + rng.uniform(0.3, 3), a + rng.uniform(3, 5)))
        t = steps[-1][3]
    pool = [f"{rng.getrandbits(64):016x}" for _ in range(6)]
    attrs = []
    for i in range(n):
        step: dict[str, Any] = {
            sc.LLM_STEP_ID: i + rng.choice([0, 0, 0, 5]),
            sc.LLM_BATCH_SIZE: rng.choice([0, 1, 2, 3.0]),
            sc.LLM_QUEUE_WAITING: rng.choice([0, 0, 1, 4]),
            sc.LLM_QUEUE_RUNNING: rng.choice([0, 1, 2, 2]),
            sc.LLM_PREEMPTED: rng.choice([0, 0, 0, 1]),
        }
        if rng.random() < 0.8:
            step[sc.LLM_KV_CACHE_USAGE] = rng.choice([0.1, 0.5, 0.93, 1])
        if rng.random() < 0.3:
            step[sc.LLM_BATCH_REQUEST_IDS] = tuple(rng.sample([*pool[:3], 7, 7.0, True, "r-1"], rng.randint(1, 3)))
        attrs.append(step)
    spans = engine_window("dp0", steps, per_step_attrs=attrs, gc=[(1.0, 1.5)] if rng.random() < 0.5 else None)
    out = []
    for s in spans:
        if s.name == sc.SPAN_STEP and rng.random() < 0.8:
            links = tuple(Link("a" * 32, p) for p in rng.sample(pool, rng.randint(1, 4)))
            s = s._replace(links=links)  # noqa: PLW2901
        out.append(s)
    for _ in range(rng.randint(0, 3)):
        x = rng.uniform(0, t)
        out += request_trace(f"{rng.getrandbits(128):032x}", x, 0, rng.uniform(0, 3), rng.uniform(0, 9), 1.0)
    return out


def _read_random(seed: int, tmp_path: Path) -> tuple[random.Random, TraceSet, TraceSet]:
    """A random engine (every other seed a busy one) read both ways, and the generator."""
    rng = random.Random(seed)
    spans = random_engine(rng) if seed % 2 else _busy_engine(rng)
    path = tmp_path / "engine.jsonl"
    write_spans(path, spans, rng)
    compiled, plain = read_both(path)
    assert _compiled(compiled)
    return rng, compiled, plain


@pytest.mark.parametrize("seed", range(40))
def test_random_engines_read_compiled_and_analyse_the_same(seed: int, tmp_path: Path) -> None:
    _, compiled, plain = _read_random(seed, tmp_path)
    assert_same(compiled, plain)


def _intervals(rng: random.Random, span: tuple[int, int], k: int) -> list[tuple[int, int]]:
    """``k`` random intervals inside ``span``, merged."""
    t0, t1 = span
    starts = [rng.randint(t0, t1) for _ in range(k)]
    return merge(sorted((a, a + rng.randint(0, (t1 - t0) // 4)) for a in starts))


@pytest.mark.parametrize("seed", range(40))
def test_compiled_engine_answers_as_the_python_reference(seed: int, tmp_path: Path) -> None:
    """Every question the analyzers ask about an engine's steps (``KERNELS.engine``), asked
    of the table and of the Python reference over the same engine's steps, random inputs."""
    rng, compiled, _ = _read_random(seed, tmp_path)
    views = list(compiled.engines.values())
    assert PYTHON.step_stats(views) == KERNELS.step_stats(views)
    for view in views:
        table, python = KERNELS.engine(view), PYTHON.engine(view)
        assert type(table) is not type(python)
        n = len(view.steps)
        assert python.segments() == table.segments()
        assert python.step_runs() == table.step_runs()
        assert python.step_starts() == table.step_starts()
        for lo, hi in [(0, n), (0, 0), *((rng.randint(0, n), rng.randint(0, n)) for _ in range(4))]:
            assert python.step_stats(lo, hi) == table.step_stats(lo, hi)
        starts = python.step_starts()
        span = (starts[0], view.steps[-1].step.end_ns) if starts else (0, 1)
        sweep = GapInputs(
            _intervals(rng, span, 3) if rng.random() < 0.5 else python.segments(),
            _intervals(rng, span, rng.randint(0, 5)),
            [(a, b, rng.randrange(len(GAP_CAUSES))) for a, b in _intervals(rng, span, 4)],
        )
        engine_work = [w for w in sweep.work if rng.random() < 0.6]
        windows = [(w.start_ns, w.end_ns) for w in view.windows] + _intervals(rng, span, 2)
        assert python.gaps(sweep) == table.gaps(sweep)
        found, totals = table.idle(sweep, engine_work, windows)
        expected = python.idle(sweep, engine_work, windows)
        assert (tuple(expected.gaps), expected.totals) == (tuple(found), totals)


def test_windows_without_steps_and_engines_without_windows(tmp_path: Path) -> None:
    """An engine known only from a window, one known only from steps (step-id runs stand in
    for windows), gc pauses of an engine with neither (dropped on both paths)."""
    w = span(sc.SPAN_ENGINE, 0, 10, attrs={sc.LLM_ENGINE_ID: "w-only"}, trace="1" * 32)
    loose = engine_window("dp1", [(0, 1, 2, 3), (3, 4, 5, 6), (9, 10, 11, 12)])
    loose = [s for s in loose if s.name != sc.SPAN_ENGINE]
    gc_only = span(sc.SPAN_GC, 1, 2, attrs={sc.LLM_ENGINE_ID: "nobody"}, trace="2" * 32)
    path = tmp_path / "odd.jsonl"
    write_spans(path, [w, *loose, gc_only])
    compiled, plain = read_both(path)
    assert _compiled(compiled)
    assert list(compiled.engines) == ["dp1", "w-only"]
    assert_same(compiled, plain)


def _declines(tmp_path: Path, spans: list[Span]) -> None:
    path = tmp_path / "x.jsonl"
    write_spans(path, spans)
    compiled, plain = read_both(path)
    assert not any(e.compiled is not None for e in compiled.engines.values())
    assert_same(compiled, plain)


def test_a_trace_holding_other_spans_is_built_by_python(tmp_path: Path) -> None:
    spans = engine_window("dp0", [(0, 1, 2, 3), (3, 4, 5, 6)])
    spans.append(span("my.kernel", 1, 2, parent=spans[1]))
    _declines(tmp_path, spans)


def test_a_trace_of_two_processes_is_built_by_python(tmp_path: Path) -> None:
    """Clock-skew repair moves spans between processes: only the Python build does it."""
    spans = engine_window("dp0", [(0, 1, 2, 3), (3, 4, 5, 6)])
    spans[-1] = spans[-1]._replace(service="other")
    _declines(tmp_path, spans)


def test_an_engine_id_python_formats_its_own_way_is_built_by_python(tmp_path: Path) -> None:
    spans = engine_window("dp0", [(0, 1, 2, 3)])
    spans = [s._replace(attributes={**s.attributes, sc.LLM_ENGINE_ID: 0.5}) for s in spans]
    _declines(tmp_path, spans)


def test_an_engine_on_both_sides_is_built_by_python(tmp_path: Path) -> None:
    """A line the compiled decoder declines (a bytesValue) leaves its engine spans to
    Python: the same engine's other steps must then be sorted with them, by Python."""
    first = engine_window("dp0", [(0, 1, 2, 3)])
    second = engine_window("dp0", [(5, 6, 7, 8)])
    path = tmp_path / "x.jsonl"
    write_spans(path, first, random.Random(1))
    doc = json.loads(path.read_text().splitlines()[0])
    write_spans(tmp_path / "y.jsonl", second, random.Random(1))
    lines = (tmp_path / "y.jsonl").read_text().splitlines()
    declined = json.loads(lines[0])
    attrs = declined["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    attrs.append({"key": "blob", "value": {"bytesValue": "AAE="}})
    path.write_text("\n".join([json.dumps(doc), json.dumps(declined), *lines[1:]]) + "\n")
    compiled, plain = read_both(path)
    assert not any(e.compiled is not None for e in compiled.engines.values())
    assert_same(compiled, plain)


def test_duplicates_and_orphans_are_counted_as_python_counts_them(tmp_path: Path) -> None:
    spans = engine_window("dp0", [(0, 1, 2, 3), (3, 4, 5, 6)])
    orphan = span(sc.SPAN_FORWARD, 7, 8, parent_id="f" * 16, trace=spans[0].trace_id)
    path = tmp_path / "x.jsonl"
    write_spans(path, [*spans, orphan])
    text = path.read_text()
    path.write_text(text + text)  # the file read twice
    compiled, plain = read_both(path)
    assert _compiled(compiled)
    assert any("duplicate" in w for w in compiled.warnings)
    assert any("partial traces" in w for w in compiled.warnings)
    assert_same(compiled, plain)


def test_the_table_keeps_the_read_order(tmp_path: Path) -> None:
    """Put back, the table's spans sit exactly where the plain read has them."""
    rng = random.Random(7)
    spans = _busy_engine(rng) + random_engine(rng)
    rng.shuffle(spans)
    path = tmp_path / "x.jsonl"
    write_spans(path, spans, rng)
    table = new_engine_table()
    assert table is not None
    loaded = load_spans(str(path), table=table)
    assert 0 < len(table) < len(spans)
    assert table.merged_with(loaded.spans) == load_spans(str(path)).spans


def test_filters_take_the_table_spans_back(tmp_path: Path) -> None:
    """--service / --since keep or drop whole traces: read with a table, the same spans."""
    engine = [s._replace(service="engine") for s in engine_window("dp0", [(0, 1, 2, 3)])]
    spans = engine + request_trace("c" * 32, 0, 0, 1, 2, 1.0)
    path = tmp_path / "x.jsonl"
    write_spans(path, spans)
    for kwargs in ({"services": ["engine"]}, {"since_ns": spans[0].start_ns - 1}):
        table = new_engine_table()
        assert table is not None
        loaded = load_spans(str(path), table=table, **kwargs)
        assert len(table) == 0
        assert loaded.spans == load_spans(str(path), **kwargs).spans


def test_compiled_steps_behave_as_a_tuple(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    write_spans(path, engine_window("dp0", [(i * 4, i * 4 + 1, i * 4 + 2, i * 4 + 3) for i in range(9)]))
    compiled, plain = read_both(path)
    steps, expected = compiled.engines["dp0"].steps, plain.engines["dp0"].steps
    assert len(steps) == 9
    assert steps[0] == expected[0]
    assert steps[-1] == expected[-1]
    assert steps[2:5] == expected[2:5]
    assert steps[::3] == expected[::3]
    assert steps == expected
    assert list(reversed(steps)) == list(reversed(expected))
    with pytest.raises(IndexError):
        steps[9]
    assert compiled.engines["dp0"] == plain.engines["dp0"]  # the handle is not compared


def test_a_declined_line_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    """The decoder may decline a line after some of its engine spans went into the table:
    they must leave it again, or they would be read twice."""
    spans = engine_window("dp0", [(0, 1, 2, 3), (3, 4, 5, 6)])
    path = tmp_path / "x.jsonl"
    write_spans(path, spans, random.Random(99))
    lines = path.read_text().splitlines()
    doc = json.loads(lines[-1])
    last = doc["resourceSpans"][-1]["scopeSpans"][0]["spans"][-1]
    last["attributes"].append({"key": "blob", "value": {"kvlistValue": {"values": []}}})
    path.write_text("\n".join([*lines[:-1], json.dumps(doc)]) + "\n")
    compiled, plain = read_both(path)
    assert compiled.span_count == plain.span_count == len(spans)
    assert_same(compiled, plain)


def test_an_engine_idle_result_keeps_its_own_gaps(tmp_path: Path) -> None:
    """The gaps of a compiled engine stay in Rust, owned by the result: measuring the same
    engine again with other inputs must not change what an earlier result reads."""
    from llmtrace.analysis import gpu_idle

    path = tmp_path / "sim.jsonl"
    write_jsonl(str(path), SimConfig(duration_s=3, arrival_rate=30, seed=8))
    compiled, _ = read_both(path)
    engine = next(iter(compiled.engines.values()))
    first = gpu_idle.engine_idle(engine, compiled.requests, compiled.tokenize)
    before = tuple(first.gaps)
    second = gpu_idle.engine_idle(engine, (), ())  # no requests, no tokenize spans
    gpu_idle.iter_gaps(engine, (), ())
    assert tuple(second.gaps) != before  # other work waiting: other gaps
    assert tuple(first.gaps) == before


def test_a_trace_set_of_some_compiled_engines_counts_only_their_steps(tmp_path: Path) -> None:
    """The overall verdict's step statistics cover the trace set's engines, not every
    engine of the table behind them (a caller may narrow ``engines``)."""
    import dataclasses

    from llmtrace.analysis import summary

    spans = engine_window("dp0", [(0, 1, 2, 3), (3, 4, 5, 6)], step_attrs={sc.LLM_QUEUE_WAITING: 3})
    spans += engine_window("dp1", [(0, 1, 2, 3)], step_attrs={sc.LLM_QUEUE_WAITING: 9})
    path = tmp_path / "x.jsonl"
    write_spans(path, spans)
    compiled, plain = read_both(path)
    assert _compiled(compiled)
    one = dataclasses.replace(compiled, engines={"dp1": compiled.engines["dp1"]})
    one_plain = dataclasses.replace(plain, engines={"dp1": plain.engines["dp1"]})
    stats = summary._all_step_stats(one.engines)
    assert stats == PYTHON.step_stats([plain.engines["dp1"]])
    assert (stats.steps, stats.waiting_sum) == (1, 9.0)
    assert to_json(analyze(one)) == to_json(analyze(one_plain))
