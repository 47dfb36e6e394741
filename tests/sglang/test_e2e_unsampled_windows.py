"""The real SGLang server with engine windows never sampled (``LLMTRACE_ENGINE_SAMPLE_RATIO=0``) and
every request sampled: the scheduler hook takes its lean path (the batch's requests, none of its
numbers) in every step, and each request must still get its whole timeline from the scheduler.

The seam is the one of test_e2e_serve.py: the model is tests/sglang/tiny_lm, because SGLang's own
Llama cannot run on a CPU from its PyPI wheels."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.sglang import server as sglang_server
from tests.sglang.conftest import driven, subprocess_env
from tests.vllm import serve_driver, trace_checks

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(2400)]

REQUESTS = 4
MAX_TOKENS = 8
EXPORT_WAIT_S = 4.0


def test_every_request_keeps_its_engine_timeline_without_step_spans(sglang_python: str, tiny_model: Path,
                                                                    tmp_path: Path) -> None:
    """No llm.engine or llm.step spans; each completion's llm.request has the scheduler's queue,
    prefill and decode children, its durations and the ids of the steps it ran in, and SGLang's
    forced retraction still counts as a preemption with a second queue span."""
    traces = tmp_path / "traces.jsonl"
    env = subprocess_env(LLMTRACE_SGLANG="1", LLMTRACE_EXPORTER=f"file:{traces}", LLMTRACE_ENGINE_SAMPLE_RATIO="0",
                         SGLANG_TEST_RETRACT="1")
    server = sglang_server.launch(sglang_python, tiny_model, env=env, log_path=tmp_path / "serve.log",
                                  extra_args=[*sglang_server.CPU_ARGS, "--max-total-tokens", "2048"])
    try:
        burst = serve_driver.burst(server, requests=REQUESTS, max_tokens=MAX_TOKENS)
        time.sleep(EXPORT_WAIT_S)
    finally:
        serve_driver.stop(server)
    driven("sglang.launch_server with engine windows unsampled and forced retraction: the lean step path")
    assert [] == burst.errors
    spans = trace_checks.load(traces)
    assert [] == [s for s in spans if s.name in ("llm.step", "llm.engine", "llm.forward")]
    posts = {s.span_id for s in spans if s.name == "POST /v1/completions"}
    requests = [s for s in spans if s.name == "llm.request" and s.parent_id in posts]
    assert REQUESTS == len(requests)
    kids: dict[str, list[str]] = {}
    for span in spans:
        kids.setdefault(span.parent_id, []).append(span.name)
    for request in requests:
        a = request.attributes
        assert MAX_TOKENS == a["gen_ai.usage.output_tokens"]
        assert {"llm.queue", "llm.prefill", "llm.decode"} <= set(kids[request.span_id])
        assert a["gen_ai.latency.time_in_queue"] >= 0 and a["gen_ai.latency.time_in_model_prefill"] > 0
        assert a["llm.step.first_id"] < a["llm.step.last_id"]
        assert 1 + a.get("llm.preemptions", 0) == kids[request.span_id].count("llm.queue")
    assert sum(r.attributes.get("llm.preemptions", 0) for r in requests) >= 1
