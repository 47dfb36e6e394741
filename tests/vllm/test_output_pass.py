"""The compiled pass over a step's outputs on vLLM's API server (native/src/output_pass.rs) leaves
the request records exactly as the Python pass alone does.

Requests are opened through the adapter's own ``add_request`` path with vLLM's real
``EngineCoreRequest``; outputs are vLLM's real ``EngineCoreOutput`` structs, one of each kind the
pass meets: a decode step's one token (the compiled pass counts it), a first token carrying vLLM's
request events, two tokens at once, an engine summary in ``trace_headers``, the last output, an
empty one, a request llmtrace has no record of. The processor stands in for ``OutputProcessor``
with only the attribute the pass reads (``request_states``); tests/vllm/test_e2e_serve.py runs the
pass under the real one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from llmtrace._native import load
from llmtrace.integrations.vllm import _compiled
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm import extractors as X
from tests.vllm.conftest import requires_vllm

NATIVE = load()
pytestmark = [pytest.mark.vllm, requires_vllm,
              pytest.mark.skipif(NATIVE is None, reason="llmtrace-native not built: no compiled outputs pass")]

IDS = ("decode", "first", "double", "summary", "last", "empty")


@pytest.fixture
def api(vllm_module: Any) -> Iterator[Any]:
    from llmtrace import _runtime
    from llmtrace.integrations.vllm import _api
    from llmtrace.lifecycle.builder import BUILDER
    from tests.core.conftest import install_runtime

    install_runtime(sample_ratio=0.0)
    try:
        yield _api
    finally:
        BUILDER.flush(10)
        _runtime.reset()
        _api.API.reset()


def _open(api: Any) -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    handles = {}
    for request_id in IDS:
        request = EngineCoreRequest(request_id, list(range(3, 13)), None, SamplingParams(max_tokens=8), None,
                                    arrival_time=time.time(), lora_request=None, cache_salt=None,
                                    data_parallel_rank=None, prompt_embeds=None, prompt_is_token_ids=None,
                                    external_req_id=request_id)
        handles[request_id] = api._open_api_request(SimpleNamespace(log_stats=True, tracing_enabled=False), request)
    for request_id in ("decode", "double", "summary", "last", "empty"):
        handles[request_id].token(1, 1_000)  # past their first token
    return handles


def _outputs() -> list[Any]:
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason

    summary = X.with_summary(None, {"queue_s": 0.001, "prefill_s": 0.002})
    return [
        EngineCoreOutput(request_id="decode", new_token_ids=[7]),
        EngineCoreOutput(request_id="first", new_token_ids=[7],
                         events=[EngineCoreEvent(EngineCoreEventType.QUEUED, time.monotonic())]),
        EngineCoreOutput(request_id="double", new_token_ids=[7, 8]),
        EngineCoreOutput(request_id="summary", new_token_ids=[7], trace_headers=summary),
        EngineCoreOutput(request_id="last", new_token_ids=[7], finish_reason=FinishReason.LENGTH),
        EngineCoreOutput(request_id="empty", new_token_ids=[]),
        EngineCoreOutput(request_id="unknown", new_token_ids=[7]),
    ]


def _state(handle: Any) -> tuple[Any, ...]:
    return (list(handle.token_ns), handle.detokenize_ns, handle.finish_ns is None, handle.finish_reason,
            handle.summary_in, handle.output_tokens)


@pytest.mark.parametrize("states", [True, False], ids=["request_states", "finish_reason"])
def test_the_compiled_pass_leaves_the_records_as_the_python_pass_does(api: Any, monkeypatch: pytest.MonkeyPatch,
                                                                      states: bool) -> None:
    """The same outputs through both passes: every record with the same token times, processing
    share, engine summary and end, and the same requests still open. With ``request_states`` (how
    vLLM tells the pass which requests it still holds) and without (the finish reason says it)."""
    ends = {}
    for compiled in (NATIVE.outputs_pass if NATIVE is not None else None, None):
        monkeypatch.setattr(_compiled, "OUTPUTS_PASS", compiled)
        handles = _open(api)
        processor = SimpleNamespace(request_states={i: object() for i in IDS if i != "last"} if states else None)
        api._api_outputs(processor, _outputs(), 5_000, 5_700)
        ends[compiled is not None] = ({i: _state(h) for i, h in handles.items()}, sorted(api.API.open))
        for handle in list(api.API.open.values()):
            api._end_api(handle)
    assert ends[True] == ends[False]
    records, still_open = ends[True]
    assert records["decode"][:2] == ([1_000, 5_000], 100)  # one token at the step's time, a seventh of 700 ns
    assert records["double"][5] == 3
    assert records["summary"][4] is not None and records["last"][2:4] == (False, "length")
    assert "last" not in still_open and "decode" in still_open


def test_the_compiled_pass_leaves_what_it_cannot_read_to_python(api: Any) -> None:
    """An output whose fields are not what vLLM's are (here: no ``events``) is returned untouched
    for the Python pass, which reports what it finds; the others are still counted."""
    assert NATIVE is not None
    handles = _open(api)
    odd = SimpleNamespace(request_id="decode", new_token_ids=[7])
    regular = _outputs()[0]
    regular.request_id = "double"
    left = NATIVE.outputs_pass([odd, regular], api.API.open, None, 9_000, 10, C.SUMMARY_KEY)
    assert left == [odd]
    assert handles["decode"].token_ns == [1_000] and handles["double"].token_ns == [1_000, 9_000]
