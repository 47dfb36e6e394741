"""Checks that need SGLang objects in-process, run in SGLang's environment by the tests
(``python -m tests.sglang.probes NAME...`` prints one JSON line, ``{name: result}``; the tests
assert on it). One process runs them all: importing SGLang takes a minute on the CI machine.

Everything here is SGLang's real code: its request and output structs, its time-stats classes
pickled by SGLang's own ``__getstate__``/``__setstate__``, its finish reasons and forward modes,
and the adapter's target check against the installed package.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Callable
from typing import Any

import wrapt

from llmtrace.integrations.sglang import _constants as C
from llmtrace.integrations.sglang import extractors as X
from llmtrace.integrations.sglang.patch import SglangInstrumentor, check_targets


def _raw(target: Any) -> Any:
    """The attribute as stored on its class (a wrapt proxy once patched)."""
    parent, attribute, _original = wrapt.resolve_path(target.module, target.path)
    return vars(parent).get(attribute)


def _originals() -> dict[str, Any]:
    return {f"{t.module}:{t.path}": _raw(t) for t in C.TARGETS}


def targets() -> dict[str, Any]:
    """The all-or-nothing check on the installed SGLang, and the version guard around it."""
    from sglang.srt.managers.scheduler import Scheduler

    checked, problems = check_targets()
    result: dict[str, Any] = {"version": SglangInstrumentor.installed_version(), "checked": len(checked),
                              "targets": len(C.TARGETS), "problems": problems}
    before = _originals()
    instrumentor = SglangInstrumentor()
    instrumentor.instrument()
    wrapped = sorted(k for k, v in _originals().items() if getattr(v, "_self_llmtrace", False))
    instrumentor.uninstrument()
    result["wrapped"] = len(wrapped)
    result["restored_identical"] = before == _originals()

    original = Scheduler.run_batch

    def run_batch(self: Any, renamed: Any) -> Any:  # a changed signature
        return None

    Scheduler.run_batch = run_batch
    try:
        changed = SglangInstrumentor()
        changed.instrument()
        result["changed_signature"] = {"active": changed.active, "problems": changed.problems,
                                       "untouched": _raw(C.TARGETS[0]) is before[f"{C.TARGETS[0].module}:"
                                                                                 f"{C.TARGETS[0].path}"]}
    finally:
        Scheduler.run_batch = original

    old = SglangInstrumentor.installed_version
    SglangInstrumentor.installed_version = classmethod(lambda cls: "0.9.0")  # type: ignore[method-assign,assignment]
    try:
        newer = SglangInstrumentor()
        newer.instrument()
        result["unsupported_version"] = {"active": newer.active, "problems": newer.problems,
                                         "unchanged": before == _originals()}
    finally:
        SglangInstrumentor.installed_version = old  # type: ignore[method-assign]
    return result


def objects() -> dict[str, Any]:
    """The extractors on real SGLang objects, and the carrier through SGLang's own pickling."""
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, FINISH_MATCHED_TOKEN
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.observability.req_time_stats import (
        APIServerReqTimeStats,
        DPControllerReqTimeStats,
        ReqTimeStatsBase,
        SchedulerReqTimeStats,
    )
    from sglang.srt.sampling.sampling_params import SamplingParams

    single = GenerateReqInput(text="hello world", sampling_params={"max_new_tokens": 7, "temperature": 0.5,
                                                                   "top_p": 0.9}, stream=True)
    single.normalize_batch_and_arguments()
    batch = GenerateReqInput(text=["a", "b"], sampling_params=[{"max_new_tokens": 3}, {"max_new_tokens": 4}])
    batch.normalize_batch_and_arguments()

    class Batch:  # ScheduleBatch needs a running model to build; its mode is SGLang's real enum
        def __init__(self, mode: Any, reqs: list[Any], extend: int | None) -> None:
            self.forward_mode, self.reqs, self.extend_num_tokens = mode, reqs, extend

    class Req:
        def __init__(self, rid: str) -> None:
            self.rid = rid

    instrumentor = SglangInstrumentor()
    instrumentor.instrument()
    try:
        api_stats = APIServerReqTimeStats()
        X.carry(api_stats, carrier={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
        to_scheduler = pickle.loads(pickle.dumps(api_stats))
        # The data-parallel controller copies the time stats into its own class (new_from_obj).
        through_dp = pickle.loads(pickle.dumps(DPControllerReqTimeStats.new_from_obj(to_scheduler)))
        scheduler_stats = SchedulerReqTimeStats()
        X.carry(scheduler_stats, summary={"queue_s": 0.25, "preemptions": 1, "bogus": "x"})
        to_tokenizer = pickle.loads(pickle.dumps(scheduler_stats))
        plain_state = [SchedulerReqTimeStats().__getstate__(), APIServerReqTimeStats().__getstate__()]
    finally:
        instrumentor.uninstrument()
    uninstrumented = pickle.loads(pickle.dumps(api_stats))
    class_default_left = hasattr(ReqTimeStatsBase, C.CARRY_ATTR)
    return {
        "single_ids": X.request_ids(single),
        "single_params": X.request_params(single).__dict__,
        "batch_ids": len(X.request_ids(batch)),
        "operations": [X.operation(single), X.operation(EmbeddingReqInput(text="x"))],
        "batch_max_tokens": [X.request_params(batch, i).max_tokens for i in range(2)],
        "engine_request": X.engine_request(_tokenized(SamplingParams(max_new_tokens=5, temperature=0.0)))[1:2],
        "engine_params": X.engine_request(_tokenized(SamplingParams(max_new_tokens=5, top_p=0.5)))[2].__dict__,
        "finish": [X.finish_reason(FINISH_LENGTH(length=3)), X.finish_reason(FINISH_ABORT()),
                   X.finish_reason(FINISH_MATCHED_TOKEN(matched=2)), X.finish_reason(FINISH_LENGTH(length=3).to_json()),
                   X.finish_reason(None)],
        "modes": [X.forward_mode(Batch(m, [], None)) for m in (ForwardMode.EXTEND, ForwardMode.DECODE,
                                                                ForwardMode.MIXED, ForwardMode.IDLE)],
        "decode_batch": X.batch_info(Batch(ForwardMode.DECODE, [Req("a"), Req("b")], None))._asdict(),
        "extend_batch": X.batch_info(Batch(ForwardMode.EXTEND, [Req("a")], 16))._asdict(),
        "carrier_across": X.carrier(X.carried(to_scheduler)),
        "carrier_through_dp_controller": X.carrier(X.carried(through_dp)),
        "class_default_left": class_default_left,
        "summary_across": X.summary(X.carried(to_tokenizer)),
        "plain_state_unchanged": plain_state == [SchedulerReqTimeStats().__getstate__(),
                                                 APIServerReqTimeStats().__getstate__()],
        "uninstrumented_carries": X.carried(uninstrumented) is not None,
    }


def _tokenized(sampling: Any) -> Any:
    from array import array

    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput

    return TokenizedGenerateReqInput(
        rid="r1", input_text="hi", input_ids=array("q", [5, 6, 7]), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=sampling, return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=True)


PROBES: dict[str, Callable[[], dict[str, Any]]] = {"targets": targets, "objects": objects}

if __name__ == "__main__":
    print(json.dumps({name: PROBES[name]() for name in sys.argv[1:]}, default=str))
