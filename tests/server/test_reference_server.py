"""The reference server, traced, over real loopback HTTP: request and engine traces as in the span model.

Each scenario runs in a fresh interpreter (a real uvicorn front end plus the
engine in its own process) and exports OTLP-JSON lines, read back through the
analyzer's loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmtrace import semconv
from llmtrace.analysis.model import Span
from tests.server.spans import Run, load_run

pytestmark = [pytest.mark.torch, pytest.mark.slow]

#: A KV budget far below what 12 concurrent requests need: preemption must happen.
TIGHT_ENGINE = json.dumps({"total_blocks": 12, "block_size": 8, "max_batch": 8})


@pytest.fixture(scope="module")
def loaded_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("ref") / "traces.jsonl"
    return load_run("ref_server_load.py", out, "--clients", "12", "--disconnects", "1", "--engine", TIGHT_ENGINE)


def _finished(run: Run) -> list[Span]:
    return [s for s in run.named(semconv.SPAN_REQUEST)
            if s.attr(semconv.LLM_REQUEST_FINISH_REASON) in (semconv.FINISH_STOP, semconv.FINISH_LENGTH)]


def test_every_finished_request_has_queue_prefill_decode(loaded_run: Run) -> None:
    """Each request that finished normally has the phase chain under its llm.request span."""
    finished = _finished(loaded_run)
    assert 11 == len(finished)
    for request in finished:
        names = {s.name for s in loaded_run.children(request)}
        assert {semconv.SPAN_TOKENIZE, semconv.SPAN_QUEUE, semconv.SPAN_PREFILL, semconv.SPAN_DECODE} <= names


def test_no_span_per_token(loaded_run: Run) -> None:
    """Streaming decodes each token, yet there is one llm.tokenize per request and no
    llm.detokenize span per token: the decode time is summed on llm.request."""
    requests = loaded_run.named(semconv.SPAN_REQUEST)
    assert len(requests) == len(loaded_run.named(semconv.SPAN_TOKENIZE))
    assert [] == loaded_run.named(semconv.SPAN_DETOKENIZE)
    assert all((r.attr(semconv.LLM_DETOKENIZE_TOTAL_S) or 0) > 0 for r in _finished(loaded_run))


def test_request_span_is_a_child_of_the_http_server_span(loaded_run: Run) -> None:
    """With instrument() before the app is built, FastAPI's SERVER span is llm.request's parent."""
    for request in loaded_run.named(semconv.SPAN_REQUEST):
        parent = loaded_run.by_id[request.parent_id or ""]
        assert "SERVER" == parent.kind.name
        assert "POST /v1/completions" == parent.name


def test_engine_phase_spans_come_from_the_engine_process(loaded_run: Run) -> None:
    """Queue/prefill/decode are emitted by the engine process into the API server's trace."""
    for span in loaded_run.named(semconv.SPAN_PREFILL):
        assert "engine" == span.resource.get(semconv.LLMTRACE_PROCESS_ROLE)
        parent = loaded_run.by_id[span.parent_id or ""]
        assert semconv.SPAN_REQUEST == parent.name
        assert "api-server" == parent.resource.get(semconv.LLMTRACE_PROCESS_ROLE)


def test_step_links_resolve_to_request_spans(loaded_run: Run) -> None:
    """Every llm.step link points at an llm.request span in the same export."""
    steps = loaded_run.named(semconv.SPAN_STEP)
    assert steps
    linked = 0
    for step in steps:
        assert len(step.links) == step.attr(semconv.LLM_BATCH_SIZE)
        for link in step.links:
            target = loaded_run.by_id.get(link.span_id)
            assert target is not None and semconv.SPAN_REQUEST == target.name
            linked += 1
    assert linked > 0


def test_steps_sit_in_engine_windows_with_children(loaded_run: Run) -> None:
    """llm.step spans are children of llm.engine roots and have schedule/forward/sample/postprocess."""
    for step in loaded_run.named(semconv.SPAN_STEP):
        root = loaded_run.by_id[step.parent_id or ""]
        assert semconv.SPAN_ENGINE == root.name and root.parent_id is None
        assert "dp0" == step.attr(semconv.LLM_ENGINE_ID)
        names = [c.name for c in loaded_run.children(step)]
        if step.attr(semconv.LLM_BATCH_SIZE):
            assert [semconv.SPAN_SCHEDULE, semconv.SPAN_FORWARD, semconv.SPAN_SAMPLE,
                    semconv.SPAN_POSTPROCESS] == sorted(names, key=["llm.schedule", "llm.forward",
                                                                    "llm.sample", "llm.postprocess"].index)


def test_preemption_yields_a_second_queue_span(loaded_run: Run) -> None:
    """Under a tight KV budget some request is preempted: two llm.queue spans and llm.preemptions >= 1."""
    preempted = [r for r in _finished(loaded_run) if (r.attr(semconv.LLM_PREEMPTIONS) or 0) >= 1]
    assert preempted, "the tight KV budget should have forced a preemption"
    for request in preempted:
        queues = loaded_run.children(request, semconv.SPAN_QUEUE)
        assert len(queues) == 1 + request.attr(semconv.LLM_PREEMPTIONS)
        assert sorted(q.attr(semconv.LLM_QUEUE_INDEX) for q in queues) == list(range(len(queues)))


def test_disconnect_ends_request_as_abort_and_frees_slot(loaded_run: Run) -> None:
    """The client that hung up mid-stream: its request ends as abort (status ERROR) and the engine is idle."""
    aborted = [r for r in loaded_run.named(semconv.SPAN_REQUEST)
               if r.attr(semconv.LLM_REQUEST_FINISH_REASON) == semconv.FINISH_ABORT]
    assert 1 == len(aborted)
    assert "ERROR" == aborted[0].status.name
    stats = loaded_run.result["stats_after"]
    assert 0 == stats["open_requests"]
    assert stats["total_blocks"] == stats["free_blocks"]


def test_request_attributes_agree_with_engine_durations(loaded_run: Run) -> None:
    """llm.request carries TTFT/e2e and the engine's queue/prefill/decode durations."""
    for request in _finished(loaded_run):
        ttft = request.attr(semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)
        e2e = request.attr(semconv.GEN_AI_LATENCY_E2E)
        assert ttft is not None and e2e is not None and 0 < ttft <= e2e
        assert request.attr(semconv.GEN_AI_LATENCY_TIME_IN_QUEUE) is not None
        prefill = loaded_run.children(request, semconv.SPAN_PREFILL)[0]
        assert abs(prefill.duration_ns / 1e9 - request.attr(semconv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL)) < 1e-3
        first, last = request.attr(semconv.LLM_STEP_FIRST_ID), request.attr(semconv.LLM_STEP_LAST_ID)
        assert first is not None and last is not None and first <= last


def test_engine_clock_offset_does_not_misplace_spans(tmp_path: Path) -> None:
    """An engine process whose monotonic clock is an hour off still puts its spans inside llm.request.

    Each process converts its own monotonic readings to wall time; only durations
    cross the process boundary, so the skew must not show.
    """
    hour_ns = str(3600 * 10**9)
    run = load_run("ref_server_load.py", tmp_path / "skew.jsonl", "--clients", "3", "--disconnects", "0",
                   "--engine-clock-skew-ns", hour_ns)
    slack_ns = 20_000_000  # scheduling jitter between the two processes' clock reads
    checked = 0
    engine_pids = set()
    for request in run.named(semconv.SPAN_REQUEST):
        for child in run.children(request):
            assert request.start_ns - slack_ns <= child.start_ns
            assert child.end_ns <= request.end_ns + slack_ns
            if child.resource.get(semconv.LLMTRACE_PROCESS_ROLE) == "engine":
                checked += 1
                engine_pids.add(child.resource.get("process.pid"))
    assert checked >= 9  # queue, prefill and decode of each of the 3 requests
    assert engine_pids and engine_pids <= set(run.result["skewed_pids"])  # the skew was really applied there


def test_engine_process_dying_fails_open_requests_cleanly(tmp_path: Path) -> None:
    """Killing the engine mid-stream: every stream ends at once with an error event, each request
    span ends as error, /health and new requests get 503 while the supervisor restarts the engine
    — nothing hangs — and once it is back the server serves again."""
    run = load_run("ref_server_engine_dies.py", tmp_path / "dies.jsonl")
    assert [["error:engine_unavailable"]] * 3 == run.result["finishes"]
    assert 503 == run.result["health"]
    assert 503 == run.result["after_status"]
    assert (200, 1) == (run.result["restarted_status"], run.result["restarts"])
    requests = run.named(semconv.SPAN_REQUEST)
    ended = [r for r in requests if r.attr(semconv.LLM_REQUEST_FINISH_REASON) == semconv.FINISH_ERROR]
    assert 4 == len(ended)  # the three streams and the request refused after the death
    assert all("ERROR" == r.status.name for r in ended)


#: Every prompt starts with this system prompt, several KV blocks long.
SYSTEM_PROMPT = "You are the reference engine's assistant; answer briefly and cite the span model. " * 4


def test_a_shared_system_prompt_is_served_from_the_prefix_cache(tmp_path: Path) -> None:
    """Four requests one after another share a system prompt: the first computes it, the
    others are served its full KV blocks from the prefix cache, on their spans, on the steps
    that admitted them and in the API's ``usage.prompt_tokens_details``; with a modeled prefill
    cost of 10 ms per computed prompt token (the hit saves ~60 tokens, ~0.6 s), their TTFT is
    shorter than the first's."""
    run = load_run("ref_server_load.py", tmp_path / "traces.jsonl", "--clients", "4", "--disconnects", "0",
                   "--sequential", "--max-tokens", "4", "--shared-prefix", SYSTEM_PROMPT,
                   "--engine", json.dumps({"block_size": 16, "prefill_token_delay_s": 0.01}))
    requests = sorted(run.named(semconv.SPAN_REQUEST), key=lambda s: s.start_ns)
    assert 4 == len(requests)
    cached = [r.attr(semconv.LLM_PROMPT_TOKENS_CACHED) for r in requests]
    assert 0 == cached[0]
    for request, hit in zip(requests[1:], cached[1:], strict=True):
        assert isinstance(hit, int) and hit > 0 and 0 == hit % 16, cached
        assert hit == request.attr(semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)
        prompt = request.attr(semconv.GEN_AI_USAGE_INPUT_TOKENS)
        assert isinstance(prompt, int) and hit < prompt
        assert prompt - hit == request.attr(semconv.LLM_PROMPT_TOKENS_COMPUTED)
    usage_cached = [c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in run.result["clients"]]
    assert cached == usage_cached
    step_cached = sum(int(s.attr(semconv.LLM_BATCH_CACHED_TOKENS) or 0) for s in run.named(semconv.SPAN_STEP))
    assert sum(cached) == step_cached
    ttft = [r.attr(semconv.LLM_TTFT_S) for r in requests]
    assert all(isinstance(t, float) and t < ttft[0] for t in ttft[1:]), ttft
