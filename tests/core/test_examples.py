"""The worked examples run and produce the traces they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llmtrace import semconv
from llmtrace.analysis.sources import load_spans

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_custom_engine_example_produces_request_and_engine_traces(tmp_path: Path) -> None:
    """examples/custom_engine.py: 12 requests with queue/prefill/decode, steps linked to them."""
    out = tmp_path / "toy.jsonl"
    subprocess.run([sys.executable, str(EXAMPLES / "custom_engine.py"), str(out)], check=True, timeout=120,
                   capture_output=True)
    spans = load_spans(str(out)).spans
    requests = [s for s in spans if s.name == semconv.SPAN_REQUEST]
    assert 12 == len(requests)
    for request in requests:
        children = {s.name for s in spans if s.parent_id == request.span_id}
        assert {semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= children
    request_ids = {r.span_id for r in requests}
    steps = [s for s in spans if s.name == semconv.SPAN_STEP]
    assert steps and all(link.span_id in request_ids for s in steps for link in s.links)
