"""The real vLLM ``LLM`` — API side, EngineCore in its own process over ZMQ, the real Scheduler
and KV-cache manager — with the fake executor, traced through the plugin entry point."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmtrace._native import load as load_native
from tests.vllm import trace_checks
from tests.vllm.conftest import PYTHON, REPO, driven, requires_vllm, subprocess_env

pytestmark = [pytest.mark.vllm, requires_vllm]

TIMEOUT_S = 400


def run_scenario(model: Path, traces: Path, *args: str, **env: str) -> list[dict[str, Any]]:
    return _scenario_lines(model, traces, *args, **env)["SCENARIO"]  # type: ignore[no-any-return]


def _scenario_lines(model: Path, traces: Path, *args: str, **env: str) -> dict[str, Any]:
    """The scenario's JSON lines by their tag: ``SCENARIO`` (what vLLM returned) and, for an engine
    in the scenario's process, ``ENGINE`` (how its steps were counted)."""
    environ = subprocess_env(LLMTRACE_EXPORTER=f"file:{traces}", **env)
    done = subprocess.run([PYTHON, "-m", "tests.vllm.scenario", str(model), *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    tagged = {tag: json.loads(rest) for tag, _, rest in (line.partition(" ") for line in done.stdout.splitlines())
              if tag in ("SCENARIO", "ENGINE")}
    assert done.returncode == 0 and "SCENARIO" in tagged, f"scenario failed ({done.returncode}):\n{done.stderr[-6000:]}"
    return tagged


@pytest.fixture(scope="module")
def preempting_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], list[Any]]:
    """8 requests x 60 tokens in 9 KV blocks of 16: the scheduler must preempt."""
    traces = tmp_path_factory.mktemp("offline") / "traces.jsonl"
    result = run_scenario(tiny_model, traces, "--requests", "8", "--max-tokens", "60", "--blocks", "9",
                          LLMTRACE_VLLM="1")
    driven("LLM.generate -> EngineCore process (ZMQ) -> Scheduler (9 KV blocks, preemption) -> fake executor; "
           "plugin via entry point in both processes")
    return result, trace_checks.load(traces)


def test_every_request_has_the_full_span_model(preempting_run: tuple[list[Any], list[Any]]) -> None:
    """tokenize (API) + queue/prefill/decode (engine) under each llm.request; steps linked both ways."""
    result, spans = preempting_run
    assert all(r["finish"] == "length" and r["tokens"] == 60 for r in result)
    report = trace_checks.check(spans, expected_requests=8)
    assert [] == report.problems


def test_phase_spans_come_from_the_engine_process(preempting_run: tuple[list[Any], list[Any]]) -> None:
    """The request span is the API server's; queue/prefill/decode are the EngineCore's, in the same trace."""
    _result, spans = preempting_run
    roles = {(s.name, s.role) for s in spans if s.name.startswith("llm.")}
    assert {("llm.request", "api-server"), ("llm.tokenize", "api-server"), ("llm.queue", "engine"),
            ("llm.prefill", "engine"), ("llm.decode", "engine"), ("llm.step", "engine")} <= roles
    assert not {("llm.prefill", "api-server"), ("llm.queue", "api-server"), ("llm.decode", "api-server")} & roles


def test_preemptions_appear_as_requeues(preempting_run: tuple[list[Any], list[Any]]) -> None:
    """Each preemption counted on a step is one more llm.queue and one more llm.preemptions."""
    _result, spans = preempting_run
    preempted = sum(s.attributes.get("llm.preempted", 0) for s in spans if s.name == "llm.step")
    requests = [s for s in spans if s.name == "llm.request"]
    queues = [s for s in spans if s.name == "llm.queue"]
    assert preempted > 0
    assert preempted == sum(r.attributes["llm.preemptions"] for r in requests)
    assert len(requests) + preempted == len(queues)


def test_output_tokens_and_usage(preempting_run: tuple[list[Any], list[Any]]) -> None:
    """Usage on llm.request matches what vLLM returned; the step ids it names exist."""
    result, spans = preempting_run
    requests = [s for s in spans if s.name == "llm.request"]
    assert [60] * len(result) == [r.attributes["gen_ai.usage.output_tokens"] for r in requests]
    assert all(r.attributes["llm.step.first_id"] < r.attributes["llm.step.last_id"] for r in requests)


def test_prefix_cache_hits_on_spans_equal_vllms_own(tiny_model: Path, tmp_path: Path) -> None:
    """Prompts sharing a long prefix, the first run alone: each llm.request says how many prompt
    tokens the prefix cache served, equal to vLLM's own ``num_cached_tokens``; the rest were
    computed; the steps that admitted them carry the same cached tokens."""
    traces = tmp_path / "traces.jsonl"
    result = run_scenario(tiny_model, traces, "--requests", "4", "--shared-prefix", LLMTRACE_VLLM="1")
    driven("prefix caching on (vLLM's default): shared-prefix prompts, cache filled by the first")
    vllm_cached = sorted(r["cached"] for r in result)
    assert vllm_cached[0] == 0 and vllm_cached[-1] > 0, vllm_cached  # the scenario really hit the cache
    spans = trace_checks.load(traces)
    requests = [s for s in spans if s.name == "llm.request"]
    assert vllm_cached == sorted(r.attributes["gen_ai.usage.cache_read.input_tokens"] for r in requests)
    for r in requests:
        a = r.attributes
        assert a["llm.prompt_tokens.cached"] == a["gen_ai.usage.cache_read.input_tokens"]
        assert a["llm.prompt_tokens.transferred"] == 0  # no KV connector
        assert a["llm.prompt_tokens.computed"] == a["gen_ai.usage.input_tokens"] - a["llm.prompt_tokens.cached"]
    step_cached = sum(s.attributes.get("llm.batch.cached_tokens", 0) for s in spans if s.name == "llm.step")
    assert sum(vllm_cached) == step_cached


def _request_metrics(traces: Path) -> tuple[int, dict[str, int]]:
    """(requests in llmtrace.queue.time, llmtrace.prompt.tokens by source) from a scenario's file."""
    metrics = trace_checks.load_metrics(traces)
    queued = sum(int(point["count"]) for point in metrics["llmtrace.queue.time"])
    tokens = {str(trace_checks.point_attributes(point)["llm.prompt_tokens.source"]): int(point["asInt"])
              for point in metrics["llmtrace.prompt.tokens"]}
    return queued, tokens


def test_unsampled_requests_metrics_come_from_vllms_own_events(tiny_model: Path, tmp_path: Path) -> None:
    """vLLM's request stats on (as in ``vllm serve``), requests unsampled, every engine window
    sampled, shared-prefix prompts: EngineCore keeps no record of any request — its steps link to
    none, yet count and list the whole batch — and the API server's request metrics, which it
    takes from vLLM's own request events, say what they say when every request is traced and
    EngineCore reports each one: every request queued, the same prompt tokens computed and cached."""
    unsampled, traced = tmp_path / "unsampled.jsonl", tmp_path / "traced.jsonl"
    args = ("--requests", "4", "--shared-prefix", "--log-stats")
    result = run_scenario(tiny_model, unsampled, *args, LLMTRACE_VLLM="1", LLMTRACE_METRICS="true",
                          LLMTRACE_SAMPLE_RATIO="0", LLMTRACE_ENGINE_SAMPLE_RATIO="1")
    run_scenario(tiny_model, traced, *args, LLMTRACE_VLLM="1", LLMTRACE_METRICS="true")
    driven("vLLM's request stats on; unsampled requests left to vLLM's events, against every request traced")
    spans = trace_checks.load(unsampled)
    assert [] == [s for s in spans if s.name in ("llm.request", "llm.queue", "llm.prefill", "llm.decode")]
    steps = [s for s in spans if s.name == "llm.step"]
    assert steps and [] == [link for s in steps for link in s.links]
    batched = set().union(*(s.attributes["llm.batch.request_ids"] for s in steps))  # vLLM's internal ids
    assert len(result) == len(batched) and {r["id"] for r in result} == {i.split("-")[0] for i in batched}
    assert max(s.attributes["llm.batch.size"] for s in steps) > 1
    assert all(len(s.attributes["llm.batch.request_ids"]) == s.attributes["llm.batch.size"] for s in steps)
    queued, tokens = _request_metrics(unsampled)
    assert len(result) == queued
    assert tokens.get("cached", 0) == sum(r["cached"] for r in result) > 0
    assert (queued, tokens) == _request_metrics(traced)


def test_stop_string_ends_the_request_on_the_api_side(tiny_model: Path, tmp_path: Path) -> None:
    """vLLM's detokenizer matches a stop string and aborts the engine request: the trace still has
    one set of engine phases and the queue/prefill the engine sent with the first token."""
    traces = tmp_path / "traces.jsonl"
    result = run_scenario(tiny_model, traces, "--requests", "2", "--max-tokens", "10", "--stop", LLMTRACE_VLLM="1")
    driven("stop-string finish (API-side detokenizer) -> engine abort")
    assert ["stop", "stop"] == [r["finish"] for r in result]
    spans = trace_checks.load(traces)
    assert [] == trace_checks.check(spans, expected_requests=2).problems
    requests = [s for s in spans if s.name == "llm.request"]
    assert ["stop", "stop"] == [r.attributes["llm.request.finish_reason"] for r in requests]
    assert 2 == sum(1 for s in spans if s.name == "llm.prefill")


def test_in_process_engine_with_instrument_call(tiny_model: Path, tmp_path: Path) -> None:
    """``llmtrace.instrument()`` before importing vLLM, engine in the same process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0): the same span model, no plugin needed."""
    traces = tmp_path / "traces.jsonl"
    run_scenario(tiny_model, traces, "--requests", "3", "--instrument", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    driven("in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) with llmtrace.instrument()")
    assert [] == trace_checks.check(trace_checks.load(traces), expected_requests=3).problems


def test_plugin_is_a_no_op_without_opt_in(tiny_model: Path, tmp_path: Path) -> None:
    """Installed but not enabled (no LLMTRACE_VLLM): vLLM runs and nothing is traced."""
    traces = tmp_path / "traces.jsonl"
    result = run_scenario(tiny_model, traces, "--requests", "2")
    assert 2 == len(result)
    assert not traces.exists()


def test_unsampled_engine_windows_still_time_every_request(tiny_model: Path, tmp_path: Path) -> None:
    """Engine windows never sampled (``LLMTRACE_ENGINE_SAMPLE_RATIO=0``), requests always: no
    llm.step spans, and each request still gets its queue/prefill/decode phases, its step ids and
    its preemptions, which EngineCore keeps without a record of such a window's steps; the steps,
    counted, still feed the batch-size histogram (every step id once, every request's decode steps
    in the sizes) and the idle ratio."""
    traces = tmp_path / "traces.jsonl"
    result = run_scenario(tiny_model, traces, "--requests", "8", "--max-tokens", "60", "--blocks", "9",
                          LLMTRACE_VLLM="1", LLMTRACE_ENGINE_SAMPLE_RATIO="0", LLMTRACE_METRICS="true")
    driven("the preempting scenario with engine windows unsampled: the scheduler hook's lean path")
    spans = trace_checks.load(traces)
    assert [] == [s for s in spans if s.name in ("llm.step", "llm.engine")]
    requests = [s for s in spans if s.name == "llm.request"]
    assert [60] * len(result) == [r.attributes["gen_ai.usage.output_tokens"] for r in requests]
    for request in requests:
        a = request.attributes
        assert a["gen_ai.latency.time_in_queue"] >= 0 and a["gen_ai.latency.time_in_model_prefill"] > 0
        assert a["llm.step.first_id"] < a["llm.step.last_id"] and a["llm.decode.steps"] >= 59
    preemptions = sum(r.attributes["llm.preemptions"] for r in requests)
    assert preemptions > 0  # 9 KV blocks for 8 requests of 100 tokens: the scheduler preempted
    assert len(requests) + preemptions == sum(1 for s in spans if s.name == "llm.queue")
    metrics = trace_checks.load_metrics(traces)
    (batch,) = metrics["llmtrace.batch.size"]
    last_step = max(r.attributes["llm.step.last_id"] for r in requests)
    assert last_step + 1 <= int(batch["count"]) < 2 * (last_step + 1)  # each step counted once, none recorded
    assert float(batch["sum"]) >= sum(r.attributes["llm.decode.steps"] for r in requests)
    (idle,) = metrics["llmtrace.gpu.idle_ratio"]
    assert 0.0 <= idle["asDouble"] < 1.0  # forward time came from the counted steps
    assert {"llm.queue", "llm.prefill", "llm.decode"} <= {s.name for s in spans}


@pytest.mark.skipif(load_native() is None, reason="llmtrace-native not built: no compiled step counter")
def test_compiled_step_counter_counts_what_the_python_reference_counts(tiny_model: Path, tmp_path: Path) -> None:
    """Requests and engine windows unsampled, vLLM's request stats on, the engine in the scenario's
    process: EngineCore keeps no request record, so the compiled core counts the windows' steps
    (native/src/step_counter.rs). The batch-size histogram and idle ratio come out as they do with
    the Python reference (``LLMTRACE_STEP_COUNTER=python``): the same steps, each counted once,
    every request in every step it was scheduled in."""
    runs = {}
    for counter in ("native", "python"):
        traces = tmp_path / f"{counter}.jsonl"
        tagged = _scenario_lines(tiny_model, traces, "--requests", "6", "--max-tokens", "40", "--log-stats",
                                 "--instrument", VLLM_ENABLE_V1_MULTIPROCESSING="0", LLMTRACE_SAMPLE_RATIO="0",
                                 LLMTRACE_ENGINE_SAMPLE_RATIO="0", LLMTRACE_METRICS="true",
                                 LLMTRACE_STEP_COUNTER=counter)
        assert [40] * 6 == [r["tokens"] for r in tagged["SCENARIO"]]
        metrics = trace_checks.load_metrics(traces)
        (batch,) = metrics["llmtrace.batch.size"]
        (idle,) = metrics["llmtrace.gpu.idle_ratio"]
        assert 0.0 <= idle["asDouble"] < 1.0
        runs[counter] = (tagged["ENGINE"]["compiled_counts"], int(batch["count"]), float(batch["sum"]))
    driven("in-process engine, every request and engine window unsampled: compiled step counter vs Python")
    (compiled,), count, total = runs["native"]
    assert [None] == runs["python"][0]
    print(f"steps {count}, counted by the compiled core {compiled}")
    assert count // 2 < compiled < count  # all but those that opened a window, closed one or came with it idle
    assert (count, total) == runs["python"][1:]
    assert total >= 6 * 40  # every request in each of its 40 token steps (and its prefill chunks)
