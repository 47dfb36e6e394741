"""The real SGLang server with its own tracing on (``--enable-trace``), two data-parallel
scheduler ranks (``--dp-size 2``: a DP controller process between the HTTP server and the
schedulers) and the adapter on: one tree per request, each rank its own engine timeline.

SGLang loads its plugins before it initialises its tracing in every process, so llmtrace's
provider is the global one when SGLang calls ``set_tracer_provider`` (OpenTelemetry refuses the
second one with a warning) and SGLang's spans go through llmtrace's provider and exporters. The
adapter writes ``llm.request``'s context into the request's ``external_trace_header``, so
SGLang's request root span (``Req <rid>``) is a child of ``llm.request``, and the spans SGLang
starts in the scheduler process nest under it through SGLang's own propagation. SGLang's
``--otlp-traces-endpoint`` points at a closed port: nothing may depend on it. The DP controller
copies each request's time stats into an object of its own class on the way to a scheduler:
the carrier must survive that copy.

The seam is the one of test_e2e_serve.py: the model is tests/sglang/tiny_lm (no attention layers).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sglang import server as sglang_server
from tests.sglang.conftest import driven, subprocess_env
from tests.sglang.test_e2e_serve import EXPORT_WAIT_S, LONG_PROMPT, MAX_TOKENS, REQUESTS, SERVE_ARGS
from tests.vllm import serve_driver, trace_checks

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(2400)]

DP_SIZE = 2
#: SGLang's own span names: its request root is `` Req <rid prefix>`` (leading space, SGLang's).
SGLANG_REQUEST_PREFIX = " Req "


@dataclass
class Traced:
    burst: serve_driver.Burst
    spans: list[trace_checks.Span]


@pytest.fixture(scope="module")
def traced(sglang_python: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    directory = tmp_path_factory.mktemp("sglang-native")
    traces = directory / "traces.jsonl"
    # SGLang's CPU path binds each rank's OpenMP threads to cores; without a binding it allows no
    # more ranks than NUMA nodes (one here). One core per rank.
    last_core = max(0, (os.cpu_count() or 1) - 1)
    env = subprocess_env(LLMTRACE_SGLANG="1", LLMTRACE_EXPORTER=f"file:{traces}",
                         LLMTRACE_SERVICE_NAME="sglang-native", SGLANG_CPU_OMP_THREADS_BIND=f"0|{min(1, last_core)}")
    closed = f"127.0.0.1:{serve_driver.free_port()}"
    server = sglang_server.launch(sglang_python, tiny_model, env=env, log_path=directory / "serve.log",
                                  extra_args=[*SERVE_ARGS, "--dp-size", str(DP_SIZE), "--enable-trace",
                                              "--otlp-traces-endpoint", closed])
    try:
        burst = serve_driver.burst(server, requests=REQUESTS, max_tokens=MAX_TOKENS, prompt=LONG_PROMPT)
        time.sleep(EXPORT_WAIT_S)
    finally:
        serve_driver.stop(server)
    driven("sglang.launch_server --enable-trace --dp-size 2 with the plugin on (HTTP server, DP controller, "
           "two schedulers, detokenizer): SGLang's request, tokenizer and scheduler spans in the same trace "
           "as llm.request; one engine timeline per rank")
    return Traced(burst, trace_checks.load(traces))


def test_sglangs_request_span_is_a_child_of_llm_request_in_one_tree(traced: Traced) -> None:
    """Every completion: SGLang's ``Req`` root under its ``llm.request``, the scheduler process's
    SGLang spans in the same trace, and every span of the trace reaches the one root."""
    assert [] == traced.burst.errors
    by_id = {s.span_id: s for s in traced.spans}
    by_trace: dict[str, list[trace_checks.Span]] = defaultdict(list)
    for span in traced.spans:
        by_trace[span.trace_id].append(span)
    posts = [s for s in traced.spans if s.name == "POST /v1/completions"]
    assert REQUESTS == len(posts)
    for post in posts:
        trace = by_trace[post.trace_id]
        requests = [s for s in trace if s.name == "llm.request"]
        sglang_roots = [s for s in trace if s.name.startswith(SGLANG_REQUEST_PREFIX)]
        assert 1 == len(requests) == len(sglang_roots), sorted(s.name for s in trace)
        assert requests[0].span_id == sglang_roots[0].parent_id
        assert "scheduler" in {s.role for s in trace if not s.name.startswith("llm.")}
        roots = [s for s in trace if s.parent_id not in by_id]
        assert [post] == roots, [s.name for s in roots]


def test_llmtraces_span_model_is_unchanged_by_sglangs_tracing(traced: Traced) -> None:
    """The adapter's own spans are complete, as without --enable-trace."""
    ours = [s for s in traced.spans if s.name.startswith("llm.") or s.name.startswith(("POST ", "GET "))]
    assert [] == trace_checks.check(ours, engine_role="scheduler").problems


def test_each_data_parallel_rank_has_its_own_engine_timeline(traced: Traced) -> None:
    """Both schedulers ran steps, named ``dp0`` and ``dp1``; no scheduler opened a request of its
    own (the carrier reached both through the DP controller)."""
    steps = [s for s in traced.spans if s.name == "llm.step"]
    assert {f"dp{rank}" for rank in range(DP_SIZE)} == {s.attributes["llm.engine.id"] for s in steps}
    assert [] == [s.attributes.get("llm.request.id") for s in traced.spans
                  if s.name == "llm.request" and s.role != "api-server"]
