"""The CLI: analyze/compare end to end, exit codes, one-line errors, help that teaches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmtrace.analysis.synthetic import SimConfig, write_jsonl
from llmtrace.cli import main


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "sim.jsonl.gz"
    write_jsonl(str(path), SimConfig(duration_s=4, arrival_rate=15))
    return path


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "slow.jsonl.gz"
    write_jsonl(str(path), SimConfig(duration_s=4, arrival_rate=15, postprocess_ms=3.0))
    return path


def test_analyze_prints_report_and_writes_json_with_required_keys(
    sim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The JSON summary has every key the schema promises (issue 6, item 10)."""
    out = tmp_path / "s.json"
    assert 0 == main(["analyze", str(sim), "--json", str(out)])
    report = capsys.readouterr().out
    assert "Bottleneck:" in report and "GPU idle" in report
    s = json.loads(out.read_text())
    assert (1, "llmtrace.analysis") == (s["schema_version"], s["schema"])
    assert s["requests"]["count"] > 0
    for key in ("ttft_s", "e2e_s"):
        assert {"p50", "p90", "p99"} <= set(s["requests"][key])
    for phase in ("tokenize", "queue", "prefill", "decode"):
        assert {"p50_s", "p99_s", "share"} <= set(s["breakdown"][phase])
    assert "share" in s["critical_path"]["llm.decode"]
    assert {"ratio", "total_s", "gaps", "with_work_waiting_s"} <= set(s["gpu_idle"]["dp0"])
    assert {"class", "evidence", "recommendation"} <= set(s["bottleneck"])
    assert isinstance(s["anomalies"], list)


def test_json_to_stdout_is_pure_json(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json - writes only JSON on stdout (pipe into jq)."""
    assert 0 == main(["analyze", str(sim), "--json", "-", "-q"])
    assert "llmtrace.analysis" == json.loads(capsys.readouterr().out)["schema"]


def test_compare_same_run_passes_and_slower_run_fails(
    sim: Path, slow_sim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare exits 0 against itself and 1 when latency regressed significantly."""
    base = tmp_path / "base.json"
    assert 0 == main(["analyze", str(sim), "--json", str(base), "-q"])
    assert 0 == main(["compare", str(base), str(sim)])
    assert "no regression" in capsys.readouterr().out
    delta = tmp_path / "delta.json"
    assert 1 == main(["compare", str(base), str(slow_sim), "--json", str(delta)])
    assert "REGRESSION" in capsys.readouterr().out
    doc = json.loads(delta.read_text())
    assert doc["regression"] is True
    e2e = next(m for m in doc["metrics"] if m["metric"] == "requests.e2e_s.p50")
    assert e2e["regression"] and e2e["p_value"] < 0.05


def test_compare_reads_a_summary_saved_again_with_sorted_keys(
    sim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summary re-saved by another tool (sorted keys, indented: "schema" far from the start)
    is still a summary, not a trace file."""
    base = tmp_path / "base.json"
    assert 0 == main(["analyze", str(sim), "--json", str(base), "-q"])
    resorted = tmp_path / "resorted.json"
    resorted.write_text(json.dumps(json.loads(base.read_text()), indent=1, sort_keys=True))
    assert resorted.read_text().find('"schema"') > 4096 + 256  # beyond what the quick look reads
    assert 0 == main(["compare", str(resorted), str(base)])
    assert "no regression" in capsys.readouterr().out


@pytest.mark.parametrize(
    "damage",
    [
        {"samples": {"ttft_s": [1, "x", None, {}], "e2e_s": "all"}},
        {"samples": []},
        {"gpu_idle": ["dp0"]},
        {"gpu_idle": {"dp0": 0.5}},
        {"requests": {"ttft_s": {"p50": "fast", "p90": None}}},
    ],
)
def test_compare_survives_a_damaged_summary(
    sim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: dict[str, object]
) -> None:
    """Found by fuzzing `llmtrace compare`: a hand-edited summary with samples or engine
    entries of the wrong type ended in an internal error. Values that are not numbers are
    left out of the comparison; the rest is compared."""
    base = tmp_path / "base.json"
    assert 0 == main(["analyze", str(sim), "--json", str(base), "-q"])
    doc = json.loads(base.read_text())
    for key, value in damage.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) and isinstance(doc[key], dict) else value
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(doc))
    for pair in ([base, damaged], [damaged, base]):
        assert main(["compare", *map(str, pair)]) in (0, 1)
        captured = capsys.readouterr()
        assert "internal error" not in captured.err and "requests.e2e_s.p50" in captured.out


def test_compare_rejects_a_summary_of_another_schema_version(
    sim: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summary with a different schema_version is a one-line error, exit 2."""
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"schema": "llmtrace.analysis", "schema_version": 99}))
    assert 2 == main(["compare", str(bad), str(sim), "-q"])
    assert "schema_version 99" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"resourceSpans": [', "bad.jsonl:line 1"),
        ("", "no spans found"),
        ('{"foo": 1}\n', "not an OTLP or Jaeger trace document"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, content: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Malformed, empty or foreign input: exit 2 and exactly one line on stderr."""
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert 2 == main(["analyze", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert 1 == len(err)
    assert expected in err[0]


def test_unreachable_jaeger_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A Jaeger URL nobody listens on: a one-line error naming the URL."""
    assert 2 == main(["analyze", "http://127.0.0.1:9", "--service", "x", "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "http://127.0.0.1:9" in err[0] and "cannot reach Jaeger" in err[0]


def test_bad_time_window_is_rejected(sim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable --since names the accepted forms."""
    assert 2 == main(["analyze", str(sim), "--since", "yesterday-ish"])
    assert "use a duration ago" in capsys.readouterr().err


def test_console_script_never_prints_a_traceback(tmp_path: Path) -> None:
    """Run as a process on a truncated gzip: exit 2, one line, no 'Traceback'."""
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\x00" * 5)
    proc = subprocess.run(
        [sys.executable, "-m", "llmtrace.cli", "analyze", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 2 == proc.returncode
    assert "Traceback" not in proc.stderr
    assert 1 == len(proc.stderr.strip().splitlines())


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """Top-level and analyze --help show runnable examples."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "llmtrace analyze http://localhost:16686" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--since" in out


def test_demo_and_doctor_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    """demo and doctor parse their documented options (implementations live elsewhere)."""
    from llmtrace.cli import build_parser

    args = build_parser().parse_args(
        [
            "demo",
            "--duration-s",
            "3",
            "--requests",
            "5",
            "--concurrency",
            "2",
            "--output",
            "x.jsonl",
            "--no-analysis",
            "--html",
            "r.html",
            "--json",
            "s.json",
        ]
    )
    assert (
        args.duration_s,
        args.requests,
        args.concurrency,
        args.output,
        args.no_analysis,
    ) == (3.0, 5, 2, "x.jsonl", True)
    args = build_parser().parse_args(["doctor", "--json", "--endpoint", "http://x:4317"])
    assert (True, "http://x:4317") == (args.json, args.endpoint)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["demo", "--concurrency", "0"], "argument --concurrency: 0 is out of range: must be >= 1"),  # hung
        (["demo", "--duration-s", "-1"], "argument --duration-s: -1 is out of range: must be > 0"),
        (["demo", "--duration-s", "inf"], "argument --duration-s: inf is not a finite number"),
        (["demo", "--requests", "0"], "argument --requests: 0 is out of range"),  # was read as "no limit"
        (["compare", "a", "b", "--threshold", "-1"], "argument --threshold: -1 is out of range: must be >= 0"),
        (["compare", "a", "b", "--alpha", "2"], "argument --alpha: 2 is out of range: must be > 0 and < 1"),
        (["analyze", "x", "--limit", "0"], "argument --limit: 0 is out of range: must be >= 1"),
        (["analyze", "x", "--anomalies", "many"], "argument --anomalies: 'many' is not an integer"),
    ],
)
def test_out_of_range_options_are_usage_errors(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A number the command cannot use is refused before anything runs, naming the option and the
    range (a negative --threshold flagged identical runs as regressions; --concurrency 0 hung)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert 2 == exit_info.value.code
    assert expected in capsys.readouterr().err


def test_non_finite_and_huge_numbers_read_as_absent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by fuzzing `llmtrace analyze`: a "NaN" time to first token (OTLP/JSON allows it),
    an infinite latency or an output-token count beyond float range ended in an internal
    error. Such values are not measurements: they read as absent and the analysis completes."""
    from tests.analysis.test_sources import doc, otlp_span

    def attrs(**values: object) -> list[dict[str, object]]:
        return [{"key": k, "value": v} for k, v in values.items()]

    request = otlp_span(
        attributes=attrs(
            **{
                "gen_ai.latency.time_to_first_token": {"doubleValue": "NaN"},
                "gen_ai.latency.e2e": {"doubleValue": "Infinity"},
                "gen_ai.usage.output_tokens": {"intValue": "9" * 400},
                "gen_ai.usage.input_tokens": {"doubleValue": "-Infinity"},
            }
        )
    )
    vllm = otlp_span(
        spanId="2222222222222222",
        parentSpanId=None,
        traceId="1" * 32,
        name="llm_request",
        attributes=attrs(
            **{
                "gen_ai.latency.time_in_model_decode": {"doubleValue": "Infinity"},
                "gen_ai.latency.time_to_first_token": {"doubleValue": 1e308},
            }
        ),
    )
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(doc(request)) + "\n" + json.dumps(doc(vllm)) + "\n")
    out = tmp_path / "summary.json"
    assert 0 == main(["analyze", str(path), "--json", str(out)])
    assert "internal error" not in capsys.readouterr().err
    summary = json.loads(out.read_text())
    assert summary["requests"]["count"] == 2
