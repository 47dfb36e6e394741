"""The trace readers on damaged input: mutated real traces (tests/analysis/reader_fuzz.py) end
in spans, a warning, or one clear error line — an ``LLMTraceError`` — never another exception;
and the HTML report shows strings from a trace as text, never as markup.

A few hundred seeded cases here, on every decoder path; benchmarks/fuzz_readers.py runs 10,000
(the crashes it found are fixed and guarded by the seeds below and the named cases after them).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.errors import SourceError
from llmtrace.analysis.report.html import render_html
from llmtrace.analysis.sources import load_spans
from llmtrace.analysis.synthetic import SimConfig, simulate
from tests.analysis.reader_fuzz import carrier_case, case, jaeger_transport, outcome

CASES_PER_BLOCK = 50
DECODERS = ["generic", *(["native"] if KERNELS.compiled else [])]


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)  # a bad carrier is logged, by llmtrace once and by OTel's parser each time


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("block", range(2))
def test_a_damaged_trace_file_reads_or_fails_in_one_line(decoder: str, block: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case through load_spans(path): spans, a warning, or a one-line LLMTraceError."""
    monkeypatch.setenv("LLMTRACE_ANALYSIS_DECODER", decoder)
    path = tmp_path / "case"
    outcomes = set()
    for seed in range(block * CASES_PER_BLOCK, (block + 1) * CASES_PER_BLOCK):
        the_case = case(seed)
        path.write_bytes(the_case.data)
        try:
            outcomes.add(outcome(lambda: load_spans(str(path))))
        except Exception as exc:
            raise AssertionError(f"{the_case.name}: {type(exc).__name__}: {exc}") from exc
    assert {"ok", "error"} <= outcomes  # the mutations leave some traces readable and break others


@pytest.mark.parametrize("block", range(2))
def test_a_damaged_jaeger_response_reads_or_fails_in_one_line(block: int) -> None:
    """The same cases as the answers of a Jaeger query service (v3, or legacy-only for the legacy
    model; some with a damaged services list), read through load_spans(url)."""
    for seed in range(block * CASES_PER_BLOCK, (block + 1) * CASES_PER_BLOCK):
        the_case = case(seed)
        try:
            outcome(lambda: load_spans("http://jaeger.test:16686", transport=jaeger_transport(the_case),  # noqa: B023
                                       since_ns=0, until_ns=10**18))
        except Exception as exc:
            raise AssertionError(f"{the_case.name}: {type(exc).__name__}: {exc}") from exc


def test_a_damaged_carrier_starts_a_new_trace_and_never_raises() -> None:
    """200 carriers: wrong types, truncated and bad traceparents, huge and strange strings, nesting."""
    for seed in range(200):
        name, check = carrier_case(seed)
        try:
            check()
        except Exception as exc:
            raise AssertionError(f"{name}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize(("body", "message"), [
    (b"[" * 50_000 + b"]" * 50_000, "nested too deep"),
    (b'{"result": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001, "nested too deep"),
    (json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "a\nb"}]}]}]}).encode(), "a\\nb"),
])
def test_what_the_fuzzing_found_is_one_error_line(body: bytes, message: str, tmp_path: Path) -> None:
    """JSON nested past the decoder's recursion limit, and an id holding a line break: a SourceError
    whose message is one printable line."""
    path = tmp_path / "found.json"
    path.write_bytes(body)
    with pytest.raises(SourceError) as raised:
        load_spans(str(path))
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("services", [b"[" * 50_000, b'{"services": 5}', b'{"services": ["\\ud800"]}',
                                      b'{"services": ["' + b"s" * 70_000 + b'"]}'])
def test_a_bad_jaeger_services_list_is_a_source_error(services: bytes) -> None:
    """Found by fuzzing: the services list not JSON, not a list, or naming a service no URL can carry."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=services))
    with pytest.raises(SourceError):
        load_spans("http://jaeger.test:16686", transport=transport, since_ns=0, until_ns=10**18)


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_the_html_report_shows_trace_strings_as_text(tmp_path: Path) -> None:
    """A service name, engine id, span name and attribute holding markup, in a file whose name holds
    markup and a template placeholder: the report carries them only escaped, and its own script
    and stylesheet once each."""
    docs = list(simulate(SimConfig(duration_s=1, arrival_rate=8, seed=5, service=HOSTILE, engine_id=HOSTILE)))
    for doc in docs:
        for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            if span["name"] == "llm.schedule":
                span["name"] = HOSTILE
            span.setdefault("attributes", []).append({"key": "note", "value": {"stringValue": HOSTILE}})
    path = tmp_path / "<b>trace{{JS}}.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    loaded = load_spans(str(path))
    page = render_html(to_json(analyze(build_traceset(loaded.spans), source=str(path)), include_views=True))
    assert json.dumps(HOSTILE)[1:-1].replace("<", "\\u003c") in page  # the strings are there, as data
    for markup in ("<script>alert", "<img", "<b>"):
        assert markup not in page
    assert 1 == page.count("function el(")  # the report's script, inserted once
