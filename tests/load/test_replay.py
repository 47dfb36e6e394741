"""Replay of Mooncake JSONL and Azure CSV traces: the server sees the trace's arrival times and
lengths (scaled by --speed), and shared hash_ids as shared prompt prefixes."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtrace.errors import LLMTraceError
from llmtrace.load.client import Target
from llmtrace.load.model import Outcome, Step
from llmtrace.load.replay import ReplayError, detect_format, load_replay
from llmtrace.load.runner import LoadSpec, run_load
from tests.helpers.servers import uvicorn_server
from tests.load.sse_app import build_app, sent_by_the_load

MOONCAKE = [
    {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7]},
    {"timestamp": 300, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8]},
    {"timestamp": 500, "input_length": 20, "output_length": 2, "hash_ids": []},
    {"timestamp": 1200, "input_length": 700, "output_length": 4, "hash_ids": [9]},
]
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,30,4
2023-11-16 18:15:46.9805900,12,2
2023-11-16 18:15:47.4805900,25,6
"""


@pytest.fixture
def sse_server() -> Iterator[tuple[str, Any]]:
    app = build_app()
    with uvicorn_server(app) as url:
        yield url, app


def _write_mooncake(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _replay(url: str, path: str, speed: float) -> Any:
    planned = load_replay(path, "auto", speed)
    spec = LoadSpec(target=Target(url), profile="replay", steps=(Step(0, 0.0, planned[-1].at_s + 1e-3),),
                    planned=tuple(planned), traces=False)
    return planned, run_load(spec, live=False)


def _shared_words(a: str, b: str) -> int:
    shared = 0
    for x, y in zip(a.split(), b.split(), strict=False):
        if x != y:
            break
        shared += 1
    return shared


def _offsets(log: list[Any]) -> list[float]:
    mine = sent_by_the_load(log)
    return [r.at - mine[0].at for r in mine]


def test_mooncake_replay_reproduces_times_lengths_and_shared_prefixes(sse_server: tuple[str, Any],
                                                                       tmp_path: Path) -> None:
    """--speed 2 halves the gaps; output lengths reach the server as max_tokens; the requests
    sharing hash_id 7 share the block's text, the one without shares nothing."""
    url, app = sse_server
    path = _write_mooncake(tmp_path / "trace.jsonl", MOONCAKE)
    assert "mooncake" == detect_format(path)
    planned, run = _replay(url, path, speed=2.0)
    assert [0.0, 0.15, 0.25, 0.6] == pytest.approx([p.at_s for p in planned])
    assert all(Outcome.OK is r.outcome for r in run.results)
    received = sent_by_the_load(app.state.log)
    assert [3, 5, 2, 4] == [r.max_tokens for r in received]
    for offset, p in zip(_offsets(app.state.log), planned, strict=True):
        assert abs(offset - p.at_s) < 0.1
    first, second, third, _ = (r.prompt for r in received)
    # One prompt token per word at this server: block 7 is the 512 words after the lead word of
    # both; without the block, only the lead word is shared.
    assert _shared_words(first, second) >= 1 + 512
    assert 1 == _shared_words(first, third)
    assert [600, 1100, 20, 700] == [p.input_tokens for p in planned]
    assert [600, 1100, 20, 700] == pytest.approx([r.prompt_tokens for r in run.results], abs=2)


def test_azure_csv_replay_reproduces_times_and_lengths(sse_server: tuple[str, Any], tmp_path: Path) -> None:
    url, app = sse_server
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    assert "azure" == detect_format(str(path))
    planned, run = _replay(url, str(path), speed=1.0)
    assert [0.0, 0.3, 0.8] == pytest.approx([p.at_s for p in planned])
    assert [(30, 4), (12, 2), (25, 6)] == [(p.input_tokens, p.output_tokens) for p in planned]
    assert [4, 2, 6] == [r.output_tokens for r in run.results]
    for offset, p in zip(_offsets(app.state.log), planned, strict=True):
        assert abs(offset - p.at_s) < 0.1


@pytest.mark.parametrize(("content", "message"), [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_len', "trace.jsonl:2: not JSON"),
    ('{"timestamp": 0, "input_length": 5}\n', "trace.jsonl:1: missing output_length"),
    ('{"timestamp": 0, "input_length": -5, "output_length": 1}\n', "input_length must be a non-negative number"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n', "hash_ids must be a list"),
])
def test_a_malformed_mooncake_file_names_the_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(content)
    with pytest.raises(ReplayError, match=message):
        load_replay(str(path))


def test_a_malformed_azure_file_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,thirty,4\n")
    with pytest.raises(ReplayError, match=r"a\.csv:2: ContextTokens and GeneratedTokens must be integers"):
        load_replay(str(path))
    path.write_text("TIME,Tokens\n1,2\n")
    with pytest.raises(ReplayError, match="header must have TIMESTAMP,ContextTokens,GeneratedTokens"):
        load_replay(str(path))


def test_a_trace_file_without_requests_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"resourceSpans": []}\n')
    with pytest.raises(LLMTraceError, match=r"t\.jsonl"):
        load_replay(str(path))


def test_llmtrace_trace_files_replay_request_starts_and_token_counts() -> None:
    """The analyzer's fixture of a reference-server run: every llm.request with its usage."""
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "analysis" / "reference_server.jsonl.gz"
    planned = load_replay(str(fixture), "auto", 1.0)
    assert len(planned) > 5
    assert 0.0 == planned[0].at_s
    assert all(a.at_s <= b.at_s for a, b in itertools.pairwise(planned))
    assert all(p.input_tokens > 0 and p.output_tokens > 0 for p in planned)


def test_azure_2024_timestamps_with_a_utc_offset_are_read(tmp_path: Path) -> None:
    """The 2024 release writes ``2024-05-10 00:00:00.009930+00:00``: six digits and an offset."""
    path = tmp_path / "azure2024.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,100,10\n"
                    "2024-05-10 00:00:01.509930+00:00,200,20\n2024-05-10 02:00:02+02:00,300,30\n")
    planned = load_replay(str(path), "auto", 1.0)
    assert [0.0, 1.5, 1.99007] == pytest.approx([p.at_s for p in planned])
    assert [100, 200, 300] == [p.input_tokens for p in planned]


def test_mooncake_fractional_millisecond_timestamps_are_kept(tmp_path: Path) -> None:
    path = _write_mooncake(tmp_path / "t.jsonl", [{"timestamp": 10.5, "input_length": 4, "output_length": 1},
                                                  {"timestamp": 11.25, "input_length": 4, "output_length": 1}])
    assert [0.0, 0.00075] == pytest.approx([p.at_s for p in load_replay(path, "auto", 1.0)])
