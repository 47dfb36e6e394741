"""Cohort comparison (``compare --where``): the selection syntax, the attribute ranking and
the structural diff, through the library and the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.cohort import CohortComparison, compare_cohorts
from llmtrace.analysis.model import Link, Span
from llmtrace.analysis.selection import SelectionError, parse_selection, resolve
from llmtrace.cli import main
from tests.analysis.builders import engine_window, request_trace, span
from tests.analysis.test_engine_table import write_spans

SLOW = 12
REQUESTS = 60


def _provenance(n_in: int, cached: int, transferred: int = 0) -> dict[str, object]:
    """KV provenance as the lifecycle core writes it on llm.request (docs/span-model.md)."""
    return {
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: cached + transferred,
        sc.LLM_PROMPT_TOKENS_CACHED: cached,
        sc.LLM_PROMPT_TOKENS_TRANSFERRED: transferred,
        sc.LLM_PROMPT_TOKENS_COMPUTED: n_in - cached - transferred,
    }


def _fleet(*, cached: bool = True, seed: int = 3, cause: str = "lora") -> list[Span]:
    """60 requests, one every 50 ms, served by one engine. Exactly 12 requests are slow
    (500 ms prefill, and a detokenize phase the others lack): with ``cause="lora"`` those on
    LoRA adapter "b", while prompt length, model and cached share (the GenAI key alone, on
    half the requests) are drawn at random; with ``cause="cache"`` those whose prompt the
    prefix cache missed (every other request has >= 90% cached), the adapter drawn at random;
    with ``"prompt"``, ``"preempted"``, ``"model"``, ``"batch"`` or ``"waiting"`` those with a
    4000-token prompt, a preemption, model "m-huge", or arriving at a step with a batch of 64
    or 9 requests waiting. ``cached=False``: no request carries a cached-token count."""
    rng = random.Random(seed)
    slow = set(rng.sample(range(REQUESTS), SLOW))
    spans: list[Span] = []
    lifetimes: list[tuple[float, float, str]] = []
    for i in range(REQUESTS):
        is_slow = i in slow
        n_in = 4000 if is_slow and cause == "prompt" else rng.choice([100, 300, 700, 1500])
        lora = ("b" if is_slow else "a") if cause == "lora" else rng.choice("ab")
        model = "m-huge" if is_slow and cause == "model" else rng.choice(["m-small", "m-large"])
        attrs: dict[str, object] = {
            sc.GEN_AI_REQUEST_MODEL: model,
            sc.LLM_REQUEST_LORA: lora,
            sc.LLM_PREEMPTIONS: int(is_slow and cause == "preempted"),
        }
        if cause == "cache":
            # Some misses received half the prompt's KV by transfer: the GenAI key counts it
            # (50%), the prefix-cache share does not (0%).
            attrs.update(_provenance(n_in, 0, n_in // 2 * (i % 2)) if is_slow else _provenance(n_in, n_in * 19 // 20))
        elif cached and rng.random() < 0.5:  # half report it: absence is not "0%"
            attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = rng.choice([0, n_in // 2, n_in])
        trace = f"{i + 1:032x}"
        start, prefill = i * 50.0, 500.0 if is_slow else 10.0
        req = request_trace(trace, start, 1.0, 2.0, prefill, 40.0, input_tokens=n_in, attrs=attrs)
        if is_slow:
            req.append(span(sc.SPAN_DETOKENIZE, start + 543.0, start + 545.0, parent=req[0]))
        spans += req
        lifetimes.append((start, start + 543.0 + (2.0 if is_slow else 0.0), req[0].span_id))
    steps = [(t, t + 1.0, t + 8.0, t + 10.0) for t in range(0, REQUESTS * 50 + 600, 10)]
    window = engine_window("dp0", [tuple(map(float, s)) for s in steps])  # type: ignore[misc]
    linked = []
    for sp in window:
        if sp.name != sc.SPAN_STEP:
            linked.append(sp)
            continue
        t = (sp.start_ns - window[0].start_ns) / 1e6
        links = tuple(Link(f"{i + 1:032x}", rid) for i, (a, b, rid) in enumerate(lifetimes) if a <= t <= b)
        # Request i arrives at i * 50 ms, as the step starting then begins.
        slow_arrival = t % 50 == 0 and int(t // 50) in slow
        batch = {
            sc.LLM_BATCH_SIZE: 64 if slow_arrival and cause == "batch" else len(links),
            sc.LLM_QUEUE_WAITING: 9 if slow_arrival and cause == "waiting" else 0,
        }
        linked.append(sp._replace(links=links, attributes={**sp.attributes, **batch}))
    return spans + linked


def _compare(spans: list[Span], where: str, other: str | None = None) -> CohortComparison:
    ts = build_traceset(spans)
    return compare_cohorts(ts, parse_selection(where), parse_selection(other) if other else None)


def test_the_attribute_that_fully_explains_the_slow_cohort_ranks_first() -> None:
    """The slowest 20% by TTFT are exactly the LoRA-b requests: lora=b ranks first, with
    every selected request and no other (effect 100 points), above chance associations."""
    result = _compare(_fleet(), "ttft>p80")
    top = result.factors[0]
    assert (SLOW, REQUESTS - SLOW) == (result.selected, result.other_count)
    assert ("lora", "b", SLOW, 0, 1.0, None) == (top.feature, top.value, top.selected, top.other, top.effect, top.lift)
    assert all(f.effect < 1.0 for f in result.factors[1:])
    assert "cached" not in result.absent and {"cached"} & {f.feature for f in result.factors}


@pytest.mark.parametrize(
    ("cause", "feature", "value"),
    [
        ("prompt", "prompt", "2049-4096"),
        ("preempted", "preempted", "yes"),
        ("model", "model", "m-huge"),
        ("batch", "batch@arrival", "33-64"),
        ("waiting", "waiting@arrival", "9-16"),
    ],
)
def test_each_feature_that_fully_explains_the_slow_cohort_ranks_first(cause: str, feature: str, value: str) -> None:
    """Whichever attribute alone tells the slow requests apart ranks first, effect +100 pt."""
    top = _compare(_fleet(cause=cause), "ttft>p80").factors[0]
    assert (feature, value, SLOW, 0, 1.0) == (top.feature, top.value, top.selected, top.other, top.effect)


def test_a_prefix_cache_miss_that_explains_the_slow_cohort_ranks_first() -> None:
    """The slow 20% are exactly the prefix-cache misses: cached=0% ranks first with effect
    +100 points. The share is the llm.prompt_tokens.* split (KV received by transfer is not
    a cache hit), and the adapter (llm.request.lora) is ranked too, as the noise it is here."""
    result = _compare(_fleet(cause="cache"), "ttft>p80")
    top = result.factors[0]
    assert ("cached", "0%", SLOW, 0, 1.0) == (top.feature, top.value, top.selected, top.other, top.effect)
    assert ("cached", ">=90%", REQUESTS - SLOW, 0) == next(
        (f.feature, f.value, f.selected, f.other) for f in _compare(_fleet(cause="cache"), "ttft<=p80").factors
        if f.feature == "cached"
    )
    lora = {f.value: f for f in result.factors if f.feature == "lora"}
    assert lora and all(abs(f.effect) < 1.0 for f in lora.values())
    assert SLOW == sum(f.selected for f in lora.values())


def test_a_missing_cached_token_attribute_is_absent_not_zero() -> None:
    """Without any cached-token attribute the feature is reported absent, never "0%"."""
    result = _compare(_fleet(cached=False), "ttft>p80")
    assert "cached" in result.absent
    assert not [f for f in result.factors if f.feature == "cached"]
    assert ("lora", "b") == (result.factors[0].feature, result.factors[0].value)


def test_structural_diff_names_the_added_phase_and_the_longer_one() -> None:
    """The slow cohort has a detokenize phase the others lack and a 50x longer prefill."""
    changes = {d.name: d.change for d in _compare(_fleet(), "lora=b").structure}
    assert "added" == changes[sc.SPAN_DETOKENIZE]
    assert "longer" == changes[sc.SPAN_PREFILL]
    assert "same" == changes[sc.SPAN_TOKENIZE]


def test_two_single_traces_compare_structurally() -> None:
    """trace=A vs trace=B: one request each; its values are ranked and its shape diffed."""
    result = _compare(_fleet(), f"trace={1:032x}", f"trace={2:032x}")
    assert (1, 1) == (result.selected, result.other_count)
    assert {sc.SPAN_PREFILL, sc.SPAN_STEP} <= {d.name for d in result.structure}
    assert result.factors  # a one-request selection still ranks its values


def test_two_explicit_cohorts_and_two_time_windows() -> None:
    """Two --where cohorts need not cover every request; time windows split by arrival."""
    spans = _fleet()
    early = _compare(spans, "start<+1s", "start>=+2s")
    assert (20, 20) == (early.selected, early.other_count)  # one arrival every 50 ms
    assert "start>=+2s" == early.other


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("ttft>p95", [("ttft", ">", "p95")]),
        ("e2e >= 2s and service=api", [("e2e", ">=", "2s"), ("service", "=", "api")]),
        ("start>=+30s AND start<+60s", [("start", ">=", "+30s"), ("start", "<", "+60s")]),
        ("input_tokens<=512", [("input_tokens", "<=", "512")]),
        ("model!=m-small", [("model", "!=", "m-small")]),
    ],
)
def test_selection_syntax(text: str, fields: list[tuple[str, str, str]]) -> None:
    """FIELD OP VALUE clauses joined by "and" (any case), spaces allowed around OP."""
    assert fields == [(c.field, c.op, c.value) for c in parse_selection(text).clauses]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty --where selection"),
        ("ttft", "is not FIELD OP VALUE"),
        ("latency>2s", "unknown field 'latency'"),
        ("ttft>fast", "'fast' is not a number, a duration (250ms) or a percentile (p95)"),
        ("ttft>p150", "percentile p150 is outside p0..p100"),
        ("model>3", "model is text, compare it with = or !="),
        ("input_tokens>2s", "input_tokens is a count"),
        ("ttft>+2s", "a +offset applies to start only"),
    ],
)
def test_bad_selections_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SelectionError) as info:
        parse_selection(text)
    assert message in str(info.value)


def test_percentile_and_duration_thresholds_select_the_same_requests() -> None:
    """ttft>p80 on this set is ttft>100ms: 12 slow requests; a request without the field
    is never selected."""
    ts = build_traceset(_fleet())
    by_pct = resolve(parse_selection("ttft>p80"), ts.requests)
    by_ms = resolve(parse_selection("ttft>100ms"), ts.requests)
    assert [by_pct(r) for r in ts.requests] == [by_ms(r) for r in ts.requests]
    assert SLOW == sum(by_ms(r) for r in ts.requests)
    assert not any(resolve(parse_selection("lora=b and tpot>0"), ts.requests)(r) for r in ts.requests)


def test_engine_selection_follows_the_steps_that_served_the_request() -> None:
    """Requests do not carry llm.engine.id: engine=dp0 selects those its steps served."""
    result = _compare(_fleet(), "ENGINE=dp0 and lora=b")
    assert SLOW == result.selected


def test_a_selection_that_selects_nothing_is_an_error() -> None:
    with pytest.raises(SelectionError, match="selects none of the 60 requests"):
        _compare(_fleet(), "ttft>10s")
    with pytest.raises(SelectionError, match="is empty"):
        _compare(_fleet(), "ttft>0s")


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cohort") / "fleet.jsonl"
    write_spans(path, _fleet())
    return path


def test_cli_cohorts_write_terminal_json_and_html(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Terminal table, versioned JSON and a self-contained HTML page, exit 0."""
    out, page = tmp_path / "c.json", tmp_path / "c.html"
    assert 0 == main(["compare", str(fleet_file), "--where", "ttft>p80", "--json", str(out), "--html", str(page)])
    text = capsys.readouterr().out
    first_row = text.split("most over-represented first")[1].splitlines()[2].split()
    assert ["lora", "b", "12", "(100%)", "0", "(0%)", "+100pt", "only", "here"] == first_row
    doc = json.loads(out.read_text())
    assert ("llmtrace.cohort", 1) == (doc["schema"], doc["schema_version"])
    assert {"feature": "lora", "value": "b"} == {k: doc["factors"][0][k] for k in ("feature", "value")}
    html = page.read_text()
    assert "<td>lora</td><td>b</td>" in html and "default-src 'none'" in html


def _as_service(spans: list[Span], service: str, engine: str) -> list[Span]:
    """The same fleet as another service on its own engine, with trace ids of its own."""

    def trace(tid: str) -> str:
        return "b" + tid[1:]

    out = []
    for sp in spans:
        attrs = {**sp.attributes, sc.LLM_ENGINE_ID: engine} if sc.LLM_ENGINE_ID in sp.attributes else sp.attributes
        links = tuple(link._replace(trace_id=trace(link.trace_id)) for link in sp.links)
        out.append(sp._replace(service=service, trace_id=trace(sp.trace_id), attributes=attrs, links=links))
    return out


def test_cli_two_services_in_two_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two sources read together, one cohort per service: every request of api-a against
    every one of api-b, and the engine each service runs ranks first in both directions."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_spans(a, _as_service(_fleet(), "api-a", "dp0"))
    write_spans(b, _as_service(_fleet(seed=4), "api-b", "dp1"))
    out = tmp_path / "c.json"
    argv = ["compare", str(a), str(b), "--where", "service=api-a", "--where", "service=api-b", "-q"]
    assert 0 == main([*argv, "--json", str(out)])
    doc = json.loads(out.read_text())
    assert (REQUESTS, REQUESTS, "service=api-b") == (doc["selected"], doc["other_count"], doc["other"])
    top = {(f["feature"], f["value"]): (f["selected"], f["other"], f["effect"]) for f in doc["factors"][:2]}
    assert {("engine", "dp0"): (REQUESTS, 0, 1.0), ("service", "api-a"): (REQUESTS, 0, 1.0)} == top
    assert "" == capsys.readouterr().out


def test_cli_bad_selection_is_one_line_exit_2(fleet_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert 2 == main(["compare", str(fleet_file), "--where", "ttft>>1s", "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert 1 == len(err) and "'>1s' is not a number" in err[0]


def test_cli_cohorts_of_a_summary_say_it_has_no_requests(
    fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A saved summary (the gate's input) cannot be split into cohorts: one line, exit 2."""
    summary = tmp_path / "s.json"
    assert 0 == main(["analyze", str(fleet_file), "--json", str(summary), "-q"])
    assert 2 == main(["compare", str(summary), "--where", "ttft>p95", "-q"])
    assert "an analysis summary holds no requests to split" in capsys.readouterr().err


def test_cli_regression_gate_still_needs_two_inputs(fleet_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --where, compare is the regression gate: BASE alone is a usage error (2),
    and --html (cohorts only) is refused."""
    assert 2 == main(["compare", str(fleet_file)])
    assert "compare needs BASE and CURRENT" in capsys.readouterr().err
    assert 2 == main(["compare", str(fleet_file), str(fleet_file), "--html", "x.html", "-q"])
    assert "--html applies to cohorts" in capsys.readouterr().err
    assert 0 == main(["compare", str(fleet_file), str(fleet_file), "-q"])


@pytest.mark.browser
def test_cli_cohort_page_renders_in_a_browser(fleet_file: Path, tmp_path: Path) -> None:
    """The --html page in headless Chromium: no console line (a CSP violation would log
    one), both tables in the DOM with a row per factor and per span name."""
    from tests.analysis.test_html_report import _chromium, _run

    page, doc = tmp_path / "c.html", tmp_path / "c.json"
    assert 0 == main(["compare", str(fleet_file), "--where", "ttft>p80", "--html", str(page), "--json", str(doc), "-q"])
    proc = _run(_chromium(), tmp_path / "profile", "--dump-dom", page.as_uri())
    assert [] == [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    result = json.loads(doc.read_text())
    assert 2 == proc.stdout.count("<table>")
    assert len(result["factors"]) + len(result["structure"]) + 2 == proc.stdout.count("<tr>")
    assert "<td>lora</td><td>b</td>" in proc.stdout
