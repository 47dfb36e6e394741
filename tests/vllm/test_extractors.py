"""The pure extractors, fed with real vLLM objects built on the CPU (and with plain stand-ins)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmtrace.integrations._targets import version_supported
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm import extractors as X
from tests.vllm.conftest import driven, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

PROMPT_LEN = 40


@pytest.fixture(scope="module")
def scheduler(vllm_module: Any, tiny_model: Path) -> Any:
    """vLLM's real v1 Scheduler and KV-cache manager, from a real VllmConfig of the tiny model."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config = EngineArgs(model=str(tiny_model), load_format="dummy", max_model_len=128, max_num_seqs=8,
                        max_num_batched_tokens=64, enforce_eager=True).create_engine_config()
    config.cache_config.num_gpu_blocks = 20
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"], spec)])
    driven("Scheduler + KVCacheManager from a real VllmConfig (CPU platform), fed real Request objects")
    return Scheduler(vllm_config=config, kv_cache_config=kv_config,
                     structured_output_manager=StructuredOutputManager(config), block_size=16)


def _request(request_id: str, max_tokens: int = 3, trace_headers: dict[str, str] | None = None) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, temperature=0.5, top_p=0.9)
    return Request(request_id, list(range(3, 3 + PROMPT_LEN)), params, None, trace_headers=trace_headers)


def test_batch_info_splits_chunked_prefill_and_decode(scheduler: Any) -> None:
    """64-token budget, two 40-token prompts: step 1 = 40 + 24 prefill; step 2 = 16 prefill + 1 decode."""
    from vllm.v1.outputs import ModelRunnerOutput

    for rid in ("a", "b"):
        scheduler.add_request(_request(rid))
    first = scheduler.schedule()
    info = X.batch_info(first, scheduler.requests)
    assert X.BatchInfo(("a", "b"), 64, 0, (), 64) == info
    runner = ModelRunnerOutput(req_ids=["a", "b"], req_id_to_index={"a": 0, "b": 1}, sampled_token_ids=[[5], []])
    scheduler.update_from_output(first, runner)
    second = scheduler.schedule()
    assert X.BatchInfo(("a", "b"), 16, 1, (), 17) == X.batch_info(second, scheduler.requests)
    runner = ModelRunnerOutput(req_ids=["a", "b"], req_id_to_index={"a": 0, "b": 1}, sampled_token_ids=[[5], [5]])
    scheduler.update_from_output(second, runner)
    third = scheduler.schedule()  # both past their prompts: the decode step counted in C
    assert X.BatchInfo(("a", "b"), 0, 2, (), 2) == X.batch_info(third, scheduler.requests)
    assert (0, 2) == X.queue_counts(scheduler.get_request_counts())
    usage = X.kv_cache_usage(scheduler.get_kv_cache_usage())
    assert usage is not None and 0.0 < usage <= 1.0


def test_request_params_from_a_real_request(vllm_module: Any) -> None:
    """Sampling parameters and prompt length, read from vLLM's engine-side Request."""
    params = X.request_params(_request("r1", max_tokens=7))
    assert X.RequestParams("r1", PROMPT_LEN, 7, 0.5, pytest.approx(0.9), False) == params  # type: ignore[arg-type]


def test_finish_reasons_of_vllm(vllm_module: Any) -> None:
    """Every vLLM FinishReason maps to the name llmtrace records."""
    from vllm.v1.engine import FinishReason

    mapped = [X.finish_reason(reason) for reason in FinishReason]
    assert ["stop", "length", "abort", "error", "repetition"] == mapped
    assert X.finish_reason(None) is None


def test_carrier_and_summary_survive_vllms_wire_format(vllm_module: Any) -> None:
    """trace_headers with our W3C context and engine summary go through vLLM's msgpack codec intact."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    headers = X.merge_carrier({"traceparent": "00-11111111111111111111111111111111-2222222222222222-01",
                               "x-other": "kept"}, carrier)
    summary = {"queue_s": 0.25, "prefill_s": 0.5, "first_step": 3, "last_step": 9, "preemptions": 1,
               "cached_tokens": 32, "transferred_tokens": 0, "draft_tokens": 12, "accepted_tokens": 7}
    output = EngineCoreOutput(request_id="r", new_token_ids=[5], trace_headers=X.with_summary(headers, summary))
    wire = MsgpackEncoder().encode(EngineCoreOutputs(outputs=[output]))
    received = MsgpackDecoder(EngineCoreOutputs).decode(wire).outputs[0]
    assert carrier == X.carrier_from(received.trace_headers)
    assert "kept" == received.trace_headers["x-other"]
    assert summary == X.decode_summary(received.trace_headers)


def test_prefix_cache_and_lora_from_vllms_own_objects(vllm_module: Any) -> None:
    """PrefillStats (on a request's first EngineCoreOutput) split into prefix-cache hits and KV
    transfer; a LoRARequest's name; absent or malformed values give None, never an exception."""
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.metrics.stats import PrefillStats
    from vllm.v1.request import Request

    stats = PrefillStats()
    stats.set(num_prompt_tokens=100, num_local_cached_tokens=48, num_external_cached_tokens=16)
    assert (48, 16) == X.prefill_cache(stats)
    assert X.prefill_cache(None) is None
    assert X.prefill_cache(object()) is None
    lora = LoRARequest("sql-adapter", 1, "/adapters/sql")
    request = Request("r2", list(range(3, 3 + PROMPT_LEN)), SamplingParams(max_tokens=2), None, lora_request=lora)
    assert "sql-adapter" == X.request_params(request).lora
    assert X.request_params(_request("r3")).lora is None


def test_cached_tokens_of_a_step_are_the_new_requests_cache_hits() -> None:
    """A SchedulerOutput's newly admitted requests carry their prefix-cache hit as num_computed_tokens."""
    output = SimpleNamespace(num_scheduled_tokens={"a": 8, "b": 24}, total_num_scheduled_tokens=32,
                             scheduled_new_reqs=[SimpleNamespace(req_id="a", num_computed_tokens=32),
                                                 SimpleNamespace(req_id="b", num_computed_tokens=0)],
                             scheduled_cached_reqs=None, preempted_req_ids=())
    assert 32 == X.batch_info(output, {}).cached_tokens


@pytest.mark.parametrize("lengths", [
    {"a": SimpleNamespace(num_prompt_tokens=10), "b": SimpleNamespace(num_prompt_tokens=4)},  # Request-like
    {"a": 10, "b": 4},  # prompt lengths as ints: the per-request loop
    {"a": SimpleNamespace(num_prompt_tokens=10), "b": None},  # a request the scheduler no longer has
], ids=["requests", "ints", "unknown"])
def test_decode_and_chunked_prefill_split_the_same_whichever_way_counted(lengths: dict[str, Any]) -> None:
    """A running request past its prompt decodes, one still inside it prefills: the C count of an
    all-decode step and the per-request loop agree, and a step mixing both is split per request."""
    def output(done: list[int]) -> Any:
        cached = SimpleNamespace(req_ids=["a", "b"], num_computed_tokens=done)
        return SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 3}, total_num_scheduled_tokens=None,
                               scheduled_new_reqs=[], scheduled_cached_reqs=cached, preempted_req_ids=())

    assert (0, 4) == (X.batch_info(output([12, 6]), lengths).prefill_tokens,
                      X.batch_info(output([12, 6]), lengths).decode_tokens)
    mixed = X.batch_info(output([12, 2]), lengths)  # b: 2 of 4 prompt tokens done, 3 scheduled
    expected = (0, 4) if lengths["b"] is None else (2, 2)
    assert expected == (mixed.prefill_tokens, mixed.decode_tokens)


def test_decode_summary_rejects_malformed_input() -> None:
    """A foreign or broken summary is ignored (None); negative values are dropped."""
    fields = len(X._SUMMARY_FIELDS)
    assert X.decode_summary({C.SUMMARY_KEY: '{"queue_s": 1}'}) is None  # not the wire format
    assert X.decode_summary({C.SUMMARY_KEY: "s1,1,2"}) is None  # too few fields
    assert X.decode_summary({C.SUMMARY_KEY: "s9" + "," * fields}) is None  # another format's tag
    assert X.decode_summary({C.SUMMARY_KEY: "s1,x" + "," * (fields - 1)}) is None  # not an integer
    assert X.decode_summary({C.SUMMARY_KEY: 7}) is None  # type: ignore[dict-item]
    assert X.decode_summary(None) is None
    negative = X.encode_summary({"queue_s": 1.0, "prefill_s": -2.0, "preemptions": -1})
    assert {"queue_s": 1.0} == X.decode_summary({C.SUMMARY_KEY: negative})
    summary = X.decode_summary({C.SUMMARY_KEY: X.encode_summary({"queue_s": 0.5, "preemptions": 1, "decode_s": None,
                                                                  "evil": 3})})
    assert {"queue_s": 0.5, "preemptions": 1} == summary


def test_summary_durations_cross_as_nanoseconds() -> None:
    """Seconds measured from nanosecond clocks come back to the nanosecond; counts stay ints."""
    sent = {"queue_s": 1_234_567 * 1e-9, "prefill_s": 0.0, "decode_s": 3_600.000000001, "decode_steps": 15}
    received = X.decode_summary({C.SUMMARY_KEY: X.encode_summary(sent)})
    assert received is not None and sent.keys() == received.keys()
    assert 15 == received["decode_steps"] and isinstance(received["decode_steps"], int)
    for key in ("queue_s", "prefill_s", "decode_s"):
        assert round(sent[key] * 1e9) == round(received[key] * 1e9)


def test_first_token_summary_keeps_only_final_values() -> None:
    """At the first token only queue, prefill, preemptions and the first step are final."""
    summary = {"queue_s": 1.0, "prefill_s": 2.0, "first_step": 4, "last_step": 4, "decode_s": 0.0,
               "preemptions": 0}
    assert {"queue_s": 1.0, "prefill_s": 2.0, "first_step": 4, "preemptions": 0} == X.first_token_summary(summary)


def test_rendered_token_lists_of_completion_and_chat_results() -> None:
    """Token lists are found in render_cmpl's list and render_chat's (conversations, inputs) pair."""
    ids_a, ids_b = [1, 2], [3]
    assert [ids_a, ids_b] == X.rendered_token_lists([{"prompt_token_ids": ids_a}, {"prompt_token_ids": ids_b}])
    assert [ids_a] == X.rendered_token_lists(([["conversation"]], [{"prompt_token_ids": ids_a}]))
    assert [ids_b] == X.rendered_token_lists([{"decoder_prompt": {"prompt_token_ids": ids_b}}])
    assert [] == X.rendered_token_lists(None)


def test_engine_id_and_model_name_from_config_stand_ins() -> None:
    """``dp<rank>`` and the first served model name."""
    config = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_rank=2),
                             model_config=SimpleNamespace(served_model_name=["tiny", "alias"], model="/m"))
    assert "dp2" == X.engine_id(config)
    assert "tiny" == X.model_name(config)
    assert "dp0" == X.engine_id(None)


@pytest.mark.parametrize(("version", "supported"), [("0.33.0", True), ("0.30.1.dev3+gabc", True),
                                                    ("0.34.0", False), ("0.29.9", False), (None, False)])
def test_version_range(version: str | None, supported: bool) -> None:
    """The declared range is inclusive below, exclusive above; dev/local suffixes are ignored."""
    assert supported == version_supported(version, C.SUPPORTED_MIN, C.SUPPORTED_MAX_EXCLUSIVE)


def test_speculative_decoding_counts_follow_vllms_accounting(scheduler: Any) -> None:
    """A verify step with k draft tokens returns the accepted drafts plus one bonus token: the
    request counts k proposed and len(new tokens) - 1 accepted, summed over its steps."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

    from llmtrace.integrations.vllm import _engine

    request = _request("spec-1", max_tokens=10)
    _engine._engine_add(scheduler, request)
    state = _engine._state(scheduler)
    handle = state.handles["spec-1"]
    for drafts, returned in (([7, 8, 9], [1, 2, 3]), ([7, 8, 9], [4]), ([], [5])):
        pending = _engine._Pending(SimpleNamespace(scheduled_spec_decode_tokens={"spec-1": drafts} if drafts else {}),
                                   None, state, 0, 0)
        outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id="spec-1", new_token_ids=returned)])
        _engine._engine_updated(scheduler, pending, {0: outputs}, 1, 2)
    assert [6, 2] == handle.spec_decode
    assert 5 == handle.output_tokens
    state.handles.pop("spec-1")
    state.tracker.aborted("spec-1")


def test_queue_waits_from_vllms_own_request_events(vllm_module: Any) -> None:
    """An unsampled request's queue time from vLLM's EngineCoreEvents as they ride on its outputs:
    QUEUED and PREEMPTED each open a wait that the next SCHEDULED closes (the engine record's
    pairing), events split across outputs included; the first output's PrefillStats give its prompt
    cache; a request never scheduled has no queue time rather than zero. The constants the adapter
    compares event types with are vLLM's own enum values."""
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput
    from vllm.v1.metrics.stats import PrefillStats

    from llmtrace.integrations.vllm._api import _StatsEvents

    assert (C.EVENT_QUEUED, C.EVENT_SCHEDULED, C.EVENT_PREEMPTED) == (
        EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED)
    stats = PrefillStats()
    stats.set(num_prompt_tokens=64, num_local_cached_tokens=32, num_external_cached_tokens=0)
    first = EngineCoreOutput(request_id="r", new_token_ids=[5], prefill_stats=stats,
                             events=[EngineCoreEvent(EngineCoreEventType.QUEUED, 10.0),
                                     EngineCoreEvent(EngineCoreEventType.SCHEDULED, 10.25)])
    preempted = EngineCoreOutput(request_id="r", new_token_ids=[5],
                                 events=[EngineCoreEvent(EngineCoreEventType.PREEMPTED, 11.0)])
    resumed = EngineCoreOutput(request_id="r", new_token_ids=[5],
                               events=[EngineCoreEvent(EngineCoreEventType.SCHEDULED, 11.5)])
    events = _StatsEvents()
    for output in (first, preempted, resumed):
        events.fold(output)
    summary = events.summary()
    assert 0.75 == pytest.approx(summary.pop("queue_s"))
    assert {"preemptions": 1, "cached_tokens": 32, "transferred_tokens": 0} == summary
    waiting = _StatsEvents()
    waiting.fold(EngineCoreOutput(request_id="w", new_token_ids=[],
                                  events=[EngineCoreEvent(EngineCoreEventType.QUEUED, 3.0)]))
    assert {"preemptions": 0} == waiting.summary()


def test_an_unsampled_request_sends_only_the_no_record_mark(vllm_module: Any) -> None:
    """API side, vLLM's stats on: an unsampled request's ``trace_headers`` hold only the mark that
    EngineCore need keep no record of it (EngineCore needs no parent context then), unless vLLM's own
    tracing parents its span on them; a sampled request sends its W3C context and no mark."""
    import time

    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    from llmtrace import _runtime
    from llmtrace.integrations.vllm import _api
    from llmtrace.lifecycle.builder import BUILDER
    from tests.core.conftest import install_runtime

    def opened(request_id: str, tracing: bool) -> dict[str, str]:
        request = EngineCoreRequest(request_id, list(range(3, 13)), None, SamplingParams(max_tokens=2), None,
                                    arrival_time=time.time(), lora_request=None, cache_salt=None,
                                    data_parallel_rank=None, prompt_embeds=None, prompt_is_token_ids=None,
                                    external_req_id=request_id)
        handle = _api._open_api_request(SimpleNamespace(log_stats=True, tracing_enabled=tracing), request)
        assert handle is not None
        _api._end_api(handle)
        return dict(request.trace_headers or {})

    try:
        install_runtime(sample_ratio=0.0)
        assert {C.NO_ENGINE_RECORD_KEY: "1"} == opened("quiet", tracing=False)
        with_tracing = opened("vllm-traced", tracing=True)
        assert C.NO_ENGINE_RECORD_KEY in with_tracing and not _sampled_flag(with_tracing["traceparent"])
        install_runtime(sample_ratio=1.0)
        sampled = opened("sampled", tracing=False)
        assert C.NO_ENGINE_RECORD_KEY not in sampled and _sampled_flag(sampled["traceparent"])
    finally:
        BUILDER.flush(10)
        _runtime.reset()
        _api.API.reset()


def _sampled_flag(traceparent: str) -> bool:
    return bool(int(traceparent.rsplit("-", 1)[1], 16) & 1)


def test_an_engine_request_with_only_the_mark_sends_no_headers_back(scheduler: Any) -> None:
    """EngineCore side: a request carrying only the no-record mark gets no record, and its outputs
    from vLLM's real Scheduler carry no ``trace_headers`` back to the API server; one whose headers
    also hold a W3C context (vLLM's own tracing on) keeps them for vLLM's span."""
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    from llmtrace.integrations.vllm import _engine

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    quiet = _request("mark-only", trace_headers={C.NO_ENGINE_RECORD_KEY: "1"})
    traced = _request("mark-and-context", trace_headers={C.NO_ENGINE_RECORD_KEY: "1", "traceparent": traceparent})
    for request in (quiet, traced):
        scheduler.add_request(request)
        _engine._engine_add(scheduler, request)
    assert not {"mark-only", "mark-and-context"} & set(_engine._state(scheduler).handles)
    output = scheduler.schedule()
    ids = list(output.num_scheduled_tokens)
    runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                               sampled_token_ids=[[5] for _ in ids])
    sent = {o.request_id: o.trace_headers for batch in scheduler.update_from_output(output, runner).values()
            for o in batch.outputs}
    assert sent["mark-only"] is None
    assert traceparent == (sent["mark-and-context"] or {}).get("traceparent")
    scheduler.finish_requests(["mark-only", "mark-and-context"], RequestStatus.FINISHED_ABORTED)
