"""The real SGLang server on the CPU, traced through the plugin: HTTP server + TokenizerManager,
Scheduler (batch formation, radix cache, KV pool, chunked prefill, forced retraction, overlap
scheduling), the model in the scheduler process, DetokenizerManager.

One server serves every test of this module: concurrent streaming completions (one client
disconnects), then the same prompt twice through the official ``openai`` client (a prefix-cache
hit). It exports to a trace file and, over OTLP, to the real collector + Jaeger of tests/stack.
The seam: the model is tests/sglang/tiny_lm (a real torch module with random weights but no
attention layers), because SGLang's own Llama cannot run on a CPU from its PyPI wheels.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.otel_stack.stack import OtelStack
from tests.sglang import server as sglang_server
from tests.sglang.conftest import driven, subprocess_env
from tests.vllm import serve_driver, trace_checks

#: A cold SGLang environment (built by the session fixture) plus a server start on two cores.
pytestmark = [pytest.mark.sglang, pytest.mark.stack, pytest.mark.timeout(2400)]

#: 41 tokens with the test tokenizer: three prefill chunks of CHUNK tokens.
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 4) + " hello"
CHUNK = 16
REQUESTS = 6
MAX_TOKENS = 8
SERVE_ARGS = [*sglang_server.CPU_ARGS, "--max-total-tokens", "2048", "--chunked-prefill-size", str(CHUNK),
              "--max-running-requests", "8"]
#: The scheduler exports within ~1 s of going idle (window flush + batch delay); SGLang's
#: shutdown kills its processes at once, so the test waits for the export before stopping it.
EXPORT_WAIT_S = 4.0


#: Over the test model's context length (4096 positions): SGLang rejects it before its scheduler.
TOO_LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 600)


@dataclass
class Served:
    burst: serve_driver.Burst
    spans: list[trace_checks.Span]
    service: str
    cached_prompt_tokens: list[int]
    rejected_status: int


def _completion_twice(base: str) -> list[int]:
    """The same prompt twice, one after the other, through the official OpenAI client: the second
    finds the first's prefix in SGLang's radix cache. Returns SGLang's usage.prompt_tokens."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    tokens = []
    for _ in range(2):
        reply = client.completions.create(model="tiny", prompt=LONG_PROMPT + " again", max_tokens=4,
                                          temperature=0.0, extra_body={"ignore_eos": True})
        tokens.append(reply.usage.prompt_tokens)
    return tokens


def _rejected(base: str) -> int:
    """A prompt over the context length through the OpenAI client: SGLang's HTTP status."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        client.completions.create(model="tiny", prompt=TOO_LONG_PROMPT, max_tokens=4)
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


@pytest.fixture(scope="module")
def served(sglang_python: str, tiny_model: Path, otel_stack: OtelStack,
           tmp_path_factory: pytest.TempPathFactory) -> Served:
    directory = tmp_path_factory.mktemp("sglang-serve")
    traces = directory / "traces.jsonl"
    service = f"sglang-e2e-{uuid.uuid4().hex[:8]}"
    env = subprocess_env(LLMTRACE_SGLANG="1", LLMTRACE_EXPORTER=f"otlp,file:{traces}",
                         LLMTRACE_ENDPOINT=otel_stack.otlp_grpc_endpoint, LLMTRACE_PROTOCOL="grpc",
                         LLMTRACE_SERVICE_NAME=service,
                         # SGLang's own test switch: retract a running decode request every 3rd step.
                         SGLANG_TEST_RETRACT="1")
    server = sglang_server.launch(sglang_python, tiny_model, env=env, log_path=directory / "serve.log",
                                  extra_args=SERVE_ARGS)
    try:
        burst = serve_driver.burst(server, requests=REQUESTS, max_tokens=MAX_TOKENS, prompt=LONG_PROMPT,
                                   abort_first=1)
        rejected_status = _rejected(server.base)
        prompt_tokens = _completion_twice(server.base)
        time.sleep(EXPORT_WAIT_S)
    finally:
        serve_driver.stop(server)
    driven("sglang.launch_server (HTTP server + TokenizerManager, Scheduler with chunked prefill, forced "
           "retraction and overlap scheduling, the model on the CPU, DetokenizerManager): streaming burst "
           "with a client disconnect, a prefix-cache hit through the openai client")
    return Served(burst, trace_checks.load(traces), service, prompt_tokens, rejected_status)


def _requests(spans: list[trace_checks.Span], *, rejected: bool = False) -> list[trace_checks.Span]:
    """The completions' llm.request spans (SGLang's /health runs a 1-token generation of its own):
    those that reached the scheduler, or (*rejected*) the ones SGLang refused before it."""
    posts = {s.span_id for s in spans if s.name == "POST /v1/completions"}
    return [s for s in spans if s.name == "llm.request" and s.parent_id in posts
            and (s.attributes.get("llm.request.finish_reason") == "error") == rejected]


def _children(spans: list[trace_checks.Span]) -> dict[str, list[trace_checks.Span]]:
    kids: dict[str, list[trace_checks.Span]] = defaultdict(list)
    for span in spans:
        kids[span.parent_id].append(span)
    return kids


def test_every_request_is_fully_traced_across_the_three_processes(served: Served) -> None:
    """llm.request under the HTTP span, tokenize, queue/prefill/decode from the scheduler process,
    linked steps with schedule/forward/postprocess, all in one trace per request."""
    assert [] == served.burst.errors
    requests = _requests(served.spans)
    assert REQUESTS + 2 == len(requests)
    others = [s for s in served.spans if s.name != "llm.request" or s in requests]
    assert [] == trace_checks.check(others, engine_role="scheduler").problems
    roles = Counter(s.role for s in served.spans)
    assert {"api-server", "scheduler"} <= set(roles)


def test_client_disconnect_is_an_aborted_request(served: Served) -> None:
    """The request whose client went away ends as ``abort`` with status ERROR; the others ``length``."""
    reasons = Counter(s.attributes["llm.request.finish_reason"] for s in _requests(served.spans))
    assert {"abort": 1, "length": REQUESTS + 1} == dict(reasons)
    aborted = [s for s in _requests(served.spans) if s.attributes["llm.request.finish_reason"] == "abort"]
    assert aborted[0].status in ("STATUS_CODE_ERROR", "2")


def test_retraction_is_a_preemption_with_a_second_queue_span(served: Served) -> None:
    """SGLang's retract_decode: the step counts it, the request has llm.preemptions and queues again."""
    steps = [s for s in served.spans if s.name == "llm.step"]
    assert sum(s.attributes["llm.preempted"] for s in steps) >= 1
    kids = _children(served.spans)
    preempted = [r for r in _requests(served.spans) if r.attributes.get("llm.preemptions", 0) >= 1]
    assert preempted, "no request reports a preemption"
    for request in preempted:
        queues = [k for k in kids[request.span_id] if k.name == "llm.queue"]
        assert request.attributes["llm.preemptions"] + 1 == len(queues)


def test_chunked_prefill_is_one_prefill_span_over_several_extend_steps(served: Served) -> None:
    """A 41-token prompt with 16-token chunks: the prompt tokens a request computed (those not read
    from the radix cache: the burst shares one prompt, so which request computes it all depends on
    arrival) take ceil(computed / 16) extend steps, and one llm.prefill spans them."""
    kids = _children(served.spans)
    steps = [s for s in served.spans if s.name == "llm.step"]
    extends_of: dict[str, int] = Counter()
    for step in steps:
        if step.attributes.get("llm.batch.forward_mode") == "extend":
            extends_of.update(step.attributes.get("llm.batch.request_ids") or ())
    finished = [r for r in _requests(served.spans) if "llm.prompt_tokens.computed" in r.attributes]
    assert finished
    for request in finished:
        computed = request.attributes["llm.prompt_tokens.computed"]
        extends = extends_of[request.attributes["llm.request.id"]]
        assert extends >= -(-computed // CHUNK), (computed, extends)
        assert 1 == len([k for k in kids[request.span_id] if k.name == "llm.prefill"])
    assert max(extends_of.values()) >= 3  # the request that computed the whole prompt: 16 + 16 + 9
    assert {"extend", "decode"} <= {s.attributes.get("llm.batch.forward_mode") for s in steps}
    assert max(s.attributes["llm.batch.prefill_tokens"] for s in steps) <= CHUNK


def test_steps_carry_the_engine_id_queue_counts_and_kv_usage(served: Served) -> None:
    """Every step and forward names engine ``dp0``; busy steps report waiting/running and a 0..1 KV usage."""
    steps = [s for s in served.spans if s.name == "llm.step"]
    forwards = [s for s in served.spans if s.name == "llm.forward"]
    assert {"dp0"} == {s.attributes["llm.engine.id"] for s in steps + forwards}
    for step in steps:
        assert 0.0 <= step.attributes["llm.kv_cache.usage"] <= 1.0
        assert step.attributes["llm.queue.waiting"] >= 0
    assert max(s.attributes["llm.kv_cache.usage"] for s in steps) > 0.0


def test_prefix_cache_hit_and_detokenizer_time_reach_the_request(served: Served) -> None:
    """The repeated prompt reads its prefix from the radix cache (``cached_tokens``); every request
    carries the detokenizer process's time and the scheduler's durations."""
    requests = sorted(_requests(served.spans), key=lambda s: s.start_ns)
    repeat = requests[-1]
    cached = repeat.attributes["gen_ai.usage.cache_read.input_tokens"]
    assert cached > 0
    assert served.cached_prompt_tokens[1] == repeat.attributes["gen_ai.usage.input_tokens"]
    assert repeat.attributes["gen_ai.usage.input_tokens"] == (repeat.attributes["llm.prompt_tokens.cached"]
                                                              + repeat.attributes["llm.prompt_tokens.computed"])
    # The steps that read those prefixes say so: the repeat's prefill step, and in all at least
    # what the finished requests report (the aborted one reports none).
    steps = [s for s in served.spans if s.name == "llm.step"]
    rid = repeat.attributes["llm.request.id"]
    assert any(s.attributes.get("llm.batch.cached_tokens", 0) >= cached for s in steps
               if rid in (s.attributes.get("llm.batch.request_ids") or ()))
    reported = sum(r.attributes.get("llm.prompt_tokens.cached", 0) for r in requests)
    assert sum(s.attributes.get("llm.batch.cached_tokens", 0) for s in steps) >= reported > 0
    for request in requests:
        assert request.attributes["llm.detokenize.total_s"] > 0
        assert request.attributes["gen_ai.latency.time_in_queue"] >= 0


def test_the_trace_reaches_jaeger_whole(served: Served, otel_stack: OtelStack) -> None:
    """Through the collector config into Jaeger: one completion's trace holds the HTTP span, its
    llm.request and the scheduler process's phases, with the parent links intact."""
    spans = otel_stack.find_traces(served.service, "llm.request", min_traces=REQUESTS + 2)
    by_trace: dict[str, list[Any]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    whole = [t for t in by_trace.values() if {"POST /v1/completions", "llm.request", "llm.queue", "llm.prefill",
                                                 "llm.decode", "llm.tokenize"} <= {s.name for s in t}]
    assert whole, f"no complete request trace in Jaeger: {[sorted({s.name for s in t}) for t in by_trace.values()]}"
    trace = {s.name: s for s in whole[0]}
    for name in ("llm.queue", "llm.prefill", "llm.decode", "llm.tokenize"):
        assert trace["llm.request"].span_id == trace[name].parent_span_id, name
    assert trace["POST /v1/completions"].span_id == trace["llm.request"].parent_span_id


def test_overlap_scheduling_steps_overlap_and_each_keeps_its_own_phases(served: Served) -> None:
    """SGLang's overlap scheduler (its default, on here) schedules and launches batch N+1 before it
    processes batch N's result, so consecutive steps overlap in time. Keyed by batch, each step
    still has exactly its own schedule -> forward -> postprocess, in that order, and links to
    exactly the requests of its batch."""
    steps = sorted((s for s in served.spans if s.name == "llm.step"), key=lambda s: s.start_ns)
    overlapping = [(a, b) for a, b in itertools.pairwise(steps) if b.start_ns < a.end_ns]
    assert overlapping, "no two steps overlap: overlap scheduling did not run"
    kids = _children(served.spans)
    for step in steps:
        phases = sorted(kids[step.span_id], key=lambda s: s.start_ns)
        assert ["llm.schedule", "llm.forward", "llm.postprocess"] == [p.name for p in phases if p.name != "llm.gc"]
        assert step.attributes["llm.batch.size"] == len(step.attributes["llm.batch.request_ids"]) == len(step.links)


def test_a_request_sglang_rejects_before_its_scheduler_ends_as_an_error(served: Served) -> None:
    """A prompt over the context length: SGLang answers 400 from its TokenizerManager; the request's
    record ends there (finish reason ``error``, status ERROR), with no scheduler phases."""
    assert 400 == served.rejected_status
    rejected = _requests(served.spans, rejected=True)
    assert 1 == len(rejected)
    assert rejected[0].status in ("STATUS_CODE_ERROR", "2")
    assert [] == [k.name for k in _children(served.spans)[rejected[0].span_id]
                  if k.name in ("llm.queue", "llm.prefill", "llm.decode")]
