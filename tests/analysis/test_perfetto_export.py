"""``llmtrace export --format perfetto``: the real Perfetto trace processor reads the output
back, and its slices, flows and counters are the source's spans, links and measurements.

The trace processor is Perfetto's own C++ one, its WebAssembly build (what ui.perfetto.dev
runs), queried through the `perfetto` package's client: tests/helpers/perfetto_tp.py says
where it comes from. Not a double: the same parser the UI loads the file with.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import perfetto
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.synthetic import SimConfig, simulate
from llmtrace.cli import main
from tests.helpers import perfetto_tp


@pytest.fixture(autouse=True)
def _trace_processor_present(request: pytest.FixtureRequest) -> None:
    """A test that reads the export back fails (not skips) without the trace processor:
    `.ci/run setup` fetches it; `make test-fast` leaves these tests out (marker)."""
    if request.node.get_closest_marker("trace_processor") is not None:
        reason = perfetto_tp.missing()
        assert reason is None, reason


@pytest.fixture(params=["native", "python"])
def writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The export runs through each writer: the compiled one (skipped, and said so, where
    llmtrace-native is not built) and the Python reference."""
    if request.param == "native" and KERNELS.chrome_trace_events() is None:
        pytest.skip("llmtrace-native with its Chrome trace writer not built (needs cargo: pip install ./native)")
    monkeypatch.setenv("LLMTRACE_EXPORT_WRITER", request.param)
    return str(request.param)


def _gpu(doc: dict[str, Any], device: str) -> dict[str, Any]:
    """Put NVML-style GPU attributes on every llm.forward, as the sampler does."""
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                if sp["name"] == sc.SPAN_FORWARD:
                    sp.setdefault("attributes", []).extend(
                        [
                            {"key": sc.HW_GPU_ID, "value": {"stringValue": device}},
                            {"key": sc.HW_GPU_UTILIZATION, "value": {"doubleValue": 0.75}},
                            {"key": sc.HW_GPU_MEMORY_USAGE, "value": {"intValue": str(8 * 1024**3)}},
                            {"key": sc.HW_GPU_POWER, "value": {"doubleValue": 310.0}},
                        ]
                    )
    return doc


def _write(path: Path, docs: list[dict[str, Any]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(json.dumps(doc) + "\n")


def _source(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the source holds: spans per name, (step, request) links, GPU-attributed spans."""
    names: Counter[str] = Counter()
    links: set[tuple[str, str]] = set()
    gpu = 0
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    names[sp["name"]] += 1
                    links |= {(sp["spanId"], link["spanId"]) for link in sp.get("links", ())}
                    gpu += any(a["key"] == sc.HW_GPU_UTILIZATION for a in sp.get("attributes", ()))
    return {"names": names, "links": links, "gpu": gpu}


def _two_services() -> list[dict[str, Any]]:
    """Two processes, two engines: one with GPU attributes on its forwards."""
    a = list(simulate(SimConfig(duration_s=2, arrival_rate=12, seed=5, service="api-a", engine_id="dp0")))
    b = [
        _gpu(d, "0")
        for d in simulate(SimConfig(duration_s=2, arrival_rate=12, seed=6, service="api-b", engine_id="dp1"))
    ]
    return a + b


def _reversed(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same documents, last first and each one's spans last first (every child before
    its parent, as an exporter batch ends them)."""
    for doc in docs:
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                ss["spans"].reverse()
    return docs[::-1]


_FLOW_PAIRS = """
select extract_arg(si.arg_set_id, 'args.span_id') as step,
       (select extract_arg(r.arg_set_id, 'args.span_id') from slice r
        where r.track_id = so.track_id and r.name = 'llm.request') as request,
       si.name as step_name
from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
"""


def _export(tmp_path: Path, docs: list[dict[str, Any]], *extra: str) -> Path:
    src, out = tmp_path / "src.jsonl.gz", tmp_path / "trace.json"
    _write(src, docs)
    assert 0 == main(["export", str(src), "--format", "perfetto", "-o", str(out), "-q", *extra])
    return out


@pytest.mark.trace_processor
def test_trace_processor_reads_every_span_link_and_counter_back(tmp_path: Path, writer: str) -> None:
    """Slice counts per name equal the source's spans; each flow joins a step and a request
    it linked, every link once; GPU and queue counters are there; the parser logs no error."""
    docs = _two_services()
    want = _source(docs)
    with perfetto_tp.trace_processor(_export(tmp_path, docs)) as tp:
        got_names = Counter({r.name: r.n for r in tp.query("select name, count(*) as n from slice group by name")})
        pairs = [(r.step, r.request, r.step_name) for r in tp.query(_FLOW_PAIRS)]
        counters = {
            r.name: r.n
            for r in tp.query(
                "select t.name as name, count(*) as n from counter c "
                "join counter_track t on c.track_id = t.id group by t.name"
            )
        }
        threads = {r.name for r in tp.query("select name from thread where name is not null")}
        engine_side = {
            (r.name, r.thread)
            for r in tp.query(
                "select s.name as name, t.name as thread from slice s join thread_track tt on s.track_id = tt.id "
                "join thread t using (utid) where s.name in ('llm.step', 'llm.gc', 'llm.engine', 'llm.forward')"
            )
        }
        processes = {r.name for r in tp.query("select name from process where name is not null")}
        errors = [
            (r.name, r.value)
            for r in tp.query("select name, value from stats where severity in ('error', 'data_loss') and value > 0")
        ]
    assert want["names"] == got_names
    assert want["links"] == {(step, req) for step, req, _ in pairs}
    assert len(want["links"]) == len(pairs)
    assert {sc.SPAN_STEP} == {name for _, _, name in pairs}
    assert want["gpu"] == counters["gpu 0 utilization %"] == counters["gpu 0 power W"] == counters["gpu 0 memory GiB"]
    assert want["names"][sc.SPAN_STEP] == counters["dp0 queue running"] + counters["dp1 queue running"]
    assert {"engine dp0", "engine dp1", "engine dp0 windows", "engine dp1 windows"} <= threads
    assert {"api-a", "api-b", "llm requests"} <= processes
    # gc (no llm.engine.id on it here) follows its window's engine; windows have their own track
    assert {
        (name, f"engine {e}{' windows' if name == sc.SPAN_ENGINE else ''}")
        for e in ("dp0", "dp1")
        for name in (sc.SPAN_STEP, sc.SPAN_GC, sc.SPAN_ENGINE, sc.SPAN_FORWARD)
    } == engine_side
    assert [] == errors


@pytest.mark.trace_processor
def test_children_before_parents_and_no_args_give_the_same_timeline(tmp_path: Path, writer: str) -> None:
    """Spans in reverse order (every child before its parent, as an exporter batch ends
    them) land on the same tracks: same slices and flows, and no nesting error."""
    docs = _reversed(_two_services())
    want = _source(docs)
    with perfetto_tp.trace_processor(_export(tmp_path, docs, "--no-args")) as tp:
        got = Counter({r.name: r.n for r in tp.query("select name, count(*) as n from slice group by name")})
        flows = next(iter(tp.query("select count(*) as n from flow"))).n
        nested_steps = next(
            iter(
                tp.query(
                    "select count(*) as n from slice c join slice p on c.parent_id = p.id "
                    "where c.name = 'llm.schedule' and p.name = 'llm.step'"
                )
            )
        ).n
        errors = [
            r.name for r in tp.query("select name from stats where severity in ('error', 'data_loss') and value > 0")
        ]
    assert want["names"] == got
    assert len(want["links"]) == flows
    assert want["names"][sc.SPAN_SCHEDULE] == nested_steps
    assert [] == errors


_FIXTURE = Path(__file__).parent.parent / "fixtures" / "analysis" / "reference_server.jsonl.gz"


@pytest.mark.trace_processor
@pytest.mark.parametrize("order", ["as recorded", "reversed"])
def test_a_real_server_run_with_aborted_requests_reads_back_whole(tmp_path: Path, order: str, writer: str) -> None:
    """The reference server's recorded run (tests/fixtures; its metric lines left out) has two client aborts whose last
    decode step ended after the request: each phase is drawn inside its request (clipped,
    or the request drawn longer when the phase is read first), so the trace processor
    keeps every span as a slice and every link as a flow, and says so in the args."""
    with gzip.open(_FIXTURE, "rt", encoding="utf-8") as fh:
        docs = [doc for line in fh if line.strip() and "resourceSpans" in (doc := json.loads(line))]
    if order == "reversed":
        docs = _reversed(docs)
    want = _source(docs)
    with perfetto_tp.trace_processor(_export(tmp_path, docs)) as tp:
        got = Counter({r.name: r.n for r in tp.query("select name, count(*) as n from slice group by name")})
        flows = next(iter(tp.query("select count(*) as n from flow"))).n
        adjusted = sorted(
            (r.name, r.clipped is not None and r.clipped > 0, r.extended is not None and r.extended > 0)
            for r in tp.query(
                f"select name, extract_arg(arg_set_id, 'args.{perfetto.CLIPPED_ARG}') as clipped, "
                f"extract_arg(arg_set_id, 'args.{perfetto.EXTENDED_ARG}') as extended from slice "
                "where clipped is not null or extended is not null"
            )
        )
        errors = [
            r.name for r in tp.query("select name from stats where severity in ('error', 'data_loss') and value > 0")
        ]
    assert want["names"] == got
    assert len(want["links"]) == flows
    # One abort's decode is read after its request (clipped), the other's before (its request
    # drawn longer); reversing the input swaps which is which.
    assert [(sc.SPAN_DECODE, True, False), (sc.SPAN_REQUEST, False, True)] == adjusted
    assert [] == errors


def test_children_whose_parent_never_comes_go_to_their_trace_track(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting children are bounded: past the limit the oldest, and at the end the rest,
    go to their trace's track, counted; none is lost."""
    from tests.analysis.builders import span

    monkeypatch.setattr(perfetto, "PENDING_LIMIT", 2)
    out = io.StringIO()
    writer = perfetto.ChromeTraceWriter(out)
    children = [span(sc.SPAN_SCHEDULE, i, i + 1, parent_id=f"{i + 1:016x}", trace=f"{i + 1:032x}") for i in range(3)]
    writer.add(children)
    assert 1 == writer.unparented  # the first one, when the third arrived
    stats = writer.close()
    slices = [e for e in json.loads(out.getvalue())["traceEvents"] if e["ph"] == "X"]
    assert (3, 3, 3) == (stats.unparented, stats.slices, len(slices))
    assert {perfetto.track_id(c.trace_id) for c in children} == {e["tid"] for e in slices}


def _export_peak_bytes(tmp_path: Path, duration_s: float) -> tuple[int, int, int]:
    """(spans, peak bytes Python allocated during the export, output bytes) for a simulated
    run of ``duration_s`` (after one untraced export, so imports and caches are warm)."""
    import tracemalloc

    docs = list(simulate(SimConfig(duration_s=duration_s, arrival_rate=20, seed=1)))
    src, out = tmp_path / f"sim{duration_s}.jsonl.gz", tmp_path / f"sim{duration_s}.json"
    _write(src, docs)
    assert 0 == main(["export", str(src), "-o", str(out), "-q"])
    tracemalloc.start()
    try:
        assert 0 == main(["export", str(src), "-o", str(out), "-q"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return sum(_source(docs)["names"].values()), peak, out.stat().st_size


def test_memory_held_does_not_grow_with_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str) -> None:
    """Streaming in bounded memory: with the writer's caches and the decoder's string cache
    made small enough to fill early, four times the spans take no more memory at peak, and
    the output written is many times that peak (it is never held)."""
    from llmtrace.cli import _export

    monkeypatch.setattr(perfetto, "RECENT_PARENTS", 256)
    monkeypatch.setattr(perfetto, "PENDING_LIMIT", 256)
    monkeypatch.setattr(perfetto, "TRACK_CACHE", 64)
    monkeypatch.setattr(_export, "_INTERN_LIMIT", 256)
    small_spans, small_peak, _ = _export_peak_bytes(tmp_path, 5)
    large_spans, large_peak, large_out = _export_peak_bytes(tmp_path, 20)
    assert large_spans > 3 * small_spans
    assert large_peak < 1.25 * small_peak
    assert large_out > 4 * large_peak


def test_export_of_a_missing_file_is_one_line_and_leaves_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: exit 2, one error line naming the file, no half-written output."""
    out = tmp_path / "t.json"
    assert 2 == main(["export", str(tmp_path / "nope.jsonl"), "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert 1 == len(err) and "nope.jsonl" in err[0]
    assert not out.exists()


def test_export_without_spans_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty source is an error (exit 2), not a silently empty timeline."""
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    assert 2 == main(["export", str(src), "-o", str(tmp_path / "t.json")])
    assert "no spans" in capsys.readouterr().err


@pytest.mark.trace_processor
@pytest.mark.stack
def test_export_from_real_jaeger_reads_back_like_the_file(otel_stack: Any, tmp_path: Path, writer: str) -> None:
    """Traces sent through the real collector into Jaeger, exported from Jaeger's query API
    (small --limit: windows are split): every span is a slice, every link a flow."""
    import time
    import urllib.request
    import uuid

    service = f"export-{uuid.uuid4().hex[:8]}"
    t0 = time.time_ns() - 20 * 1_000_000_000
    docs = list(simulate(SimConfig(duration_s=2, arrival_rate=6, service=service, t0_ns=t0, window_steps=32)))
    for doc in docs:
        req = urllib.request.Request(
            f"{otel_stack.otlp_http_endpoint}/v1/traces",
            data=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert 200 == resp.status
    otel_stack.find_traces(service, timeout_s=60, min_traces=len(docs))
    out = tmp_path / "jaeger.json"
    since = str((t0 - 5_000_000_000) / 1e9)
    argv = ["export", otel_stack.jaeger_query_url, "--service", service, "--since", since, "--limit", "4"]
    assert 0 == main([*argv, "-o", str(out), "-q"])
    want = _source(docs)
    with perfetto_tp.trace_processor(out) as tp:
        got = Counter({r.name: r.n for r in tp.query("select name, count(*) as n from slice group by name")})
        flows = next(iter(tp.query("select count(*) as n from flow"))).n
    assert want["names"] == got
    assert len(want["links"]) == flows
