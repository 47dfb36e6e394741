"""HTTP-server side of the SGLang adapter: the TokenizerManager's request records.

``_init_req_state`` opens ``llm.request`` per (sub-)request under the current (SERVER)
span and puts its W3C carrier on the request's time-stats object, which SGLang pickles
to the scheduler; ``_tokenize_one_request`` is ``llm.tokenize``; ``_handle_batch_output``
counts tokens as the server streams them, reads what the scheduler and the detokenizer
carried back (the engine's durations, the detokenizer's time) and ends finished
requests; a client disconnect (``abort_request``) or an engine-side abort ends them as
``abort``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmtrace import semconv
from llmtrace._safety import guarded
from llmtrace.integrations._common import tokenizer_call
from llmtrace.integrations._targets import Hook, binder
from llmtrace.integrations.sglang import _constants as C
from llmtrace.integrations.sglang import extractors as X
from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.lifecycle.request import RequestHandle, start_request


class _ApiState:
    """Open request records of this process's TokenizerManager, keyed by SGLang's ``rid``."""

    def __init__(self) -> None:
        self.open: dict[str, RequestHandle] = {}

    def reset(self) -> None:
        self.open.clear()

    def add(self, handle: RequestHandle) -> None:
        if len(self.open) >= C.MAX_OPEN_REQUESTS:
            self.open.pop(next(iter(self.open))).aborted(reason=semconv.FINISH_ABORT)
        self.open[handle.request_id] = handle


API = _ApiState()


@guarded("sglang.api.open")
def _open_requests(manager: Any, obj: Any, arrival_ns: int) -> list[RequestHandle]:
    handles = []
    model = X.served_model(manager)
    operation = X.operation(obj)
    for index, request_id in enumerate(X.request_ids(obj)):
        if request_id in API.open:
            continue
        params = X.request_params(obj, index)
        handle = start_request(request_id, model=model, max_tokens=params.max_tokens,
                               temperature=params.temperature, top_p=params.top_p, stream=params.stream,
                               operation=operation, attributes={semconv.GEN_AI_SYSTEM: "sglang"},
                               arrival_ns=arrival_ns)
        # The scheduler emits queue/prefill/decode: never derive them here, also on an early abort.
        handle.handed_to_engine()
        API.add(handle)
        handles.append(handle)
    if handles and getattr(manager, "enable_trace", False):
        # SGLang's own tracing (--enable-trace) roots its request span at this header: under
        # llm.request, so that one request is one tree. A batch shares its first request's.
        obj.external_trace_header = handles[0].carrier()
    return handles


@guarded("sglang.api.carrier")
def _attach_carriers(manager: Any, handles: list[RequestHandle]) -> None:
    states = getattr(manager, "rid_to_state", None) or {}
    for handle in handles:
        state = states.get(handle.request_id)
        X.carry(getattr(state, "time_stats", None), carrier=handle.carrier())


@guarded("sglang.api.close")
def _close(handles: list[RequestHandle] | None, error: BaseException) -> None:
    for handle in handles or ():
        API.open.pop(handle.request_id, None)
        handle.aborted(error if isinstance(error, Exception) else None)


def init_req_state_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_obj = binder(positions, "obj")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        handles = _open_requests(self, get_obj(args, kwargs), monotonic_ns())
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _close(handles, exc)
            raise
        if handles:
            _attach_carriers(self, handles)
        return result

    return hook


def _rid(obj: Any) -> str:
    return str(getattr(obj, "rid", ""))


@guarded("sglang.api.tokenize")
def _tokenized(obj: Any, tokenized: Any, start_ns: int, end_ns: int) -> None:
    handle = API.open.get(_rid(obj))
    if handle is None:
        return
    input_ids = getattr(tokenized, "input_ids", None)
    handle.tokenized(len(input_ids) if input_ids is not None else 0, start_ns, end_ns)


@guarded("sglang.api.rejected")
def _rejected(obj: Any, error: BaseException) -> None:
    handle = API.open.pop(_rid(obj), None)
    if handle is not None:
        handle.aborted(error if isinstance(error, Exception) else None)


def tokenize_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_obj = binder(positions, "obj")

    async def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        try:
            with tokenizer_call():  # the tokenizer integrations stay out: this is the request's llm.tokenize
                tokenized = await original(self, *args, **kwargs)
        except BaseException as exc:
            # SGLang rejected it before the scheduler saw it (a prompt over the context length):
            # SGLang drops the request's state, llmtrace ends its record with the error.
            _rejected(get_obj(args, kwargs), exc)
            raise
        _tokenized(get_obj(args, kwargs), tokenized, start, monotonic_ns())
        return tokenized

    return hook


@guarded("sglang.api.outputs")
def _outputs(recv_obj: Any, at_ns: int) -> None:
    for row in X.output_rows(recv_obj):
        handle = API.open.get(row.request_id)
        if handle is None:
            continue
        if row.completion_tokens is not None and row.completion_tokens > handle.output_tokens:
            handle.token(row.completion_tokens - handle.output_tokens, at_ns)
        if row.carried is not None:
            if (summary := X.summary(row.carried)) is not None:
                handle.engine_summary(summary)
            handle.detokenized(X.detokenize_ns(row.carried))
        if row.finish_reason is None:
            continue
        del API.open[row.request_id]
        if row.prompt_tokens is not None:
            handle.prompt_tokens = row.prompt_tokens
        if row.cached_tokens is not None:
            _cache_attributes(handle, row.cached_tokens)
        if row.finish_reason in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
            handle.aborted(reason=row.finish_reason, at_ns=at_ns)
        else:
            handle.finished(row.finish_reason, output_tokens=row.completion_tokens, at_ns=at_ns)


def _cache_attributes(handle: RequestHandle, cached: int) -> None:
    """Prefix-cache hits (SGLang's radix cache): ``cached_tokens`` of the prompt were not recomputed.
    Set on the live span (the request's own attributes were fixed when it started)."""
    if handle.span is None or not handle.recording:
        return
    attributes = {semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: cached, semconv.LLM_PROMPT_TOKENS_CACHED: cached}
    if handle.prompt_tokens is not None:
        attributes[semconv.LLM_PROMPT_TOKENS_COMPUTED] = max(0, handle.prompt_tokens - cached)
    handle.span.set_attributes(attributes)


def batch_output_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_recv = binder(positions, "recv_obj")

    async def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        now = monotonic_ns()
        result = await original(self, *args, **kwargs)  # unpickles recv_obj.time_stats in place
        _outputs(get_recv(args, kwargs), now)
        return result

    return hook


@guarded("sglang.api.abort")
def _aborted(request_id: Any, abort_all: Any) -> None:
    if abort_all:
        handles = list(API.open.values())
        API.open.clear()
    else:
        # SGLang aborts by prefix: a parent rid aborts its n>1 samples (``rid_<i>``) too.
        prefix = str(request_id or "")
        handles = [API.open.pop(rid) for rid in list(API.open) if prefix and rid.startswith(prefix)]
    for handle in handles:
        handle.aborted(reason=semconv.FINISH_ABORT)


def abort_request_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_rid = binder(positions, "rid")
    get_all = binder(positions, "abort_all")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _aborted(get_rid(args, kwargs), get_all(args, kwargs))
        return result

    return hook


def handle_abort_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_recv = binder(positions, "recv_obj")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        recv = get_recv(args, kwargs)
        result = original(self, *args, **kwargs)
        _aborted(getattr(recv, "rid", None), getattr(recv, "abort_all", False))
        return result

    return hook
