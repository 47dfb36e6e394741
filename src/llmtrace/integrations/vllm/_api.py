"""API-server side of the vLLM adapter: renders, request records, tokens as the server sees them.

``OutputProcessor.add_request`` opens ``llm.request`` (with the render that produced the
prompt as ``llm.tokenize``) and writes its W3C context into the request's
``trace_headers``; ``process_outputs`` counts tokens, reads the engine's summary from
the outputs' ``trace_headers`` (or, for an unsampled request EngineCore keeps no record of,
vLLM's own request events) and ends requests; aborts and engine errors end them too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from llmtrace import _runtime, semconv
from llmtrace._safety import guarded
from llmtrace.integrations._common import IN_TOKENIZER, tokenizer_call
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm import extractors as X
from llmtrace.integrations.vllm._binding import Hook, binder
from llmtrace.lifecycle.clock import monotonic_ns, to_mono_ns
from llmtrace.lifecycle.request import RequestHandle, in_span, start_request


# --------------------------------------------------------------------------- API-server side
class _Renders:
    """Prompt renders of this process, keyed by the identity of their token-id list.

    The list object a render produces is the one ``EngineCoreRequest.prompt_token_ids``
    carries, so the request finds its render whatever task or thread it runs in.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, int, int]] = {}

    def add(self, token_ids: Any, start_ns: int, end_ns: int) -> None:
        if len(self._by_id) >= C.MAX_RENDERS:
            self._by_id.pop(next(iter(self._by_id)))
        self._by_id[id(token_ids)] = (token_ids, start_ns, end_ns)

    def pop(self, token_ids: Any) -> tuple[int, int] | None:
        entry = self._by_id.pop(id(token_ids), None)
        if entry is None or entry[0] is not token_ids:
            return None
        return entry[1], entry[2]

    def clear(self) -> None:
        self._by_id.clear()


RENDERS = _Renders()


class _StatsEvents:
    """What an unsampled request's metrics need from the engine, taken from vLLM's own request
    events instead of an EngineCore record (:data:`C.NO_ENGINE_RECORD_KEY`): its queue waits
    (``QUEUED`` or ``PREEMPTED`` to the next ``SCHEDULED``, both in EngineCore's clock, as the
    engine's record pairs them) and its prompt cache (the first output's ``PrefillStats``)."""

    __slots__ = ("cache", "preemptions", "queue_s", "queued_at")

    def __init__(self) -> None:
        self.queued_at: float | None = None
        self.queue_s: float | None = None  # None until the request was first scheduled
        self.preemptions = 0
        self.cache: tuple[int, int] | None = None

    def fold(self, output: Any) -> None:
        """An output that carries events (the first one, and the first after a preemption)."""
        for event in output.events:
            kind, at = event.type, event.timestamp
            if kind == C.EVENT_SCHEDULED:
                if self.queued_at is not None:
                    self.queue_s = (self.queue_s or 0.0) + max(0.0, at - self.queued_at)
                    self.queued_at = None
            elif kind in (C.EVENT_QUEUED, C.EVENT_PREEMPTED):
                self.queued_at = at
                if kind == C.EVENT_PREEMPTED:
                    self.preemptions += 1
        if self.cache is None:
            self.cache = X.prefill_cache(getattr(output, "prefill_stats", None))

    def summary(self) -> dict[str, Any]:
        """In the engine summary's terms (``extractors.decode_summary``)."""
        summary: dict[str, Any] = {"preemptions": self.preemptions}
        if self.queue_s is not None:
            summary["queue_s"] = self.queue_s
        if self.cache is not None:
            summary["cached_tokens"], summary["transferred_tokens"] = self.cache
        return summary


class _ApiState:
    """Open request records of this process's OutputProcessors, keyed by vLLM's internal id."""

    def __init__(self) -> None:
        self.open: dict[str, RequestHandle] = {}
        #: The open requests EngineCore keeps no record of, and their events so far.
        self.stats_events: dict[str, _StatsEvents] = {}
        self.model: str | None = None
        #: Set once an engine summary arrived: the engine side is traced, so the API side
        #: must not approximate queue/prefill/decode itself (the engine's spans are in the trace).
        self.engine_reports = False

    def reset(self) -> None:
        self.open.clear()
        self.stats_events.clear()
        self.engine_reports = False
        RENDERS.clear()


API = _ApiState()


@guarded("vllm.render")
def _note_render(renderer: Any, start_ns: int, end_ns: int, result: Any) -> None:
    for token_ids in X.rendered_token_lists(result):
        RENDERS.add(token_ids, start_ns, end_ns)
    if API.model is None:
        API.model = X.model_name(getattr(renderer, "config", None))


def render_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    if inspect.iscoroutinefunction(original):
        async def hook_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = monotonic_ns()
            # Inside a render the tokenizer integrations pass through: the request's llm.tokenize is
            # this adapter's, measured around vLLM's renderer.
            with tokenizer_call():
                result = await original(self, *args, **kwargs)
            _note_render(self, start, monotonic_ns(), result)
            return result

        return hook_async

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        with tokenizer_call():
            result = original(self, *args, **kwargs)
        _note_render(self, start, monotonic_ns(), result)
        return result

    return hook


def _arrival_ns(request: Any, now: int, render: tuple[int, int] | None) -> int:
    if render is not None:
        return render[0]
    arrival_s = getattr(request, "arrival_time", None)
    if isinstance(arrival_s, (int, float)) and arrival_s > 0:
        # Wall time taken in *this* process (the API server; the renderer's start), so converting is sound.
        mono = to_mono_ns(int(arrival_s * 1e9))
        if 0 <= now - mono <= C.MAX_ARRIVAL_AGE_NS:
            return mono
    return now


def _request_attributes(params: X.RequestParams) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.GEN_AI_SYSTEM: "vllm"}
    if params.lora is not None:
        attrs[semconv.LLM_REQUEST_LORA] = params.lora
    return attrs


def _leave_to_stats(processor: Any, handle: RequestHandle) -> bool:
    """Whether EngineCore need keep no record of this request: it is unsampled (no span will show its
    engine phases) and what its metrics need from the engine reaches this process anyway, in vLLM's
    own request events (``log_stats``: on in ``vllm serve``), or no metrics are recorded. The engine
    records of unsampled requests were a third to two thirds of llmtrace's work per EngineCore step
    at production sampling (docs/performance.md)."""
    if handle.recording:
        return False
    return getattr(processor, "log_stats", False) is True or _runtime.serving_metrics() is None


@guarded("vllm.api.add_request")
def _open_api_request(processor: Any, request: Any) -> RequestHandle | None:
    params = X.request_params(request)
    if not params.request_id or params.request_id in API.open:
        return None  # a streaming-input continuation of a request already open
    now = monotonic_ns()
    render = RENDERS.pop(getattr(request, "prompt_token_ids", None))
    carrier = None
    if not in_span():
        # No SERVER span here: join the caller's trace that vLLM passed along (--otlp-traces-endpoint).
        carrier = X.carrier_from(getattr(request, "trace_headers", None))
    handle = start_request(params.request_id, model=API.model, prompt_tokens=params.prompt_tokens,
                           max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
                           stream=params.stream, carrier=carrier, attributes=_request_attributes(params),
                           arrival_ns=_arrival_ns(request, now, render))
    if render is not None:
        handle.tokenized(params.prompt_tokens or 0, render[0], render[1])
    incoming = getattr(request, "trace_headers", None)
    if len(API.open) >= C.MAX_OPEN_REQUESTS:
        _end_api(API.open[next(iter(API.open))], reason=semconv.FINISH_ABORT)
    API.open[params.request_id] = handle
    leave = _leave_to_stats(processor, handle)
    if leave and getattr(processor, "tracing_enabled", True) is False:
        # EngineCore keeps no record of it, so needs no parent context; vLLM's own tracing
        # (--otlp-traces-endpoint), which parents its span on the headers, is off.
        headers = dict(incoming or {})
    else:
        headers = X.merge_carrier(incoming, handle.carrier())
    if leave:
        headers[C.NO_ENGINE_RECORD_KEY] = "1"
        if _runtime.serving_metrics() is not None:  # (else nothing reads what vLLM's events say)
            API.stats_events[params.request_id] = _StatsEvents()
    request.trace_headers = headers
    return handle


def add_request_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_request = binder(positions, "request")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        handle = _open_api_request(self, get_request(args, kwargs))
        try:
            return original(self, *args, **kwargs)
        except BaseException as exc:
            if handle is not None:
                _close_api(handle, exc)
            raise

    return hook


@guarded("vllm.api.close")
def _close_api(handle: RequestHandle, error: BaseException) -> None:
    _end_api(handle, error if isinstance(error, Exception) else None)


def _end_api(handle: RequestHandle, error: Exception | None = None, reason: str | None = None) -> None:
    """End an open request early (an abort or an error), with what vLLM's events said of it."""
    API.open.pop(handle.request_id, None)
    if (events := API.stats_events.pop(handle.request_id, None)) is not None:
        handle.engine_summary(events.summary())
    handle.aborted(error, reason=reason)


# The helper below runs for every output of every engine step. It reads vLLM's ``EngineCoreOutput``
# fields directly (a msgspec struct whose fields the version range fixes) and keeps the
# per-output path free of helper calls; anything unexpected raises into ``@guarded``.
@guarded("vllm.api.outputs")
def _api_outputs(processor: Any, outputs: Any, start_ns: int, end_ns: int) -> None:
    """After vLLM processed a batch of outputs: the tokens as they reached this process (at
    *start_ns*, before vLLM detokenized them), each request's share of the processing time, the
    engine's summary where an output carries one, and the requests that ended."""
    share = (end_ns - start_ns) // len(outputs)
    states = getattr(processor, "request_states", None)
    if not isinstance(states, dict):
        states = None
    open_requests, stats_events = API.open, API.stats_events
    for output in outputs:
        request_id = output.request_id
        handle = open_requests.get(request_id)
        if handle is None:
            continue
        if token_ids := output.new_token_ids:
            if len(token_ids) == 1 and handle.finish_ns is None:
                handle.token_ns.append(start_ns)  # RequestHandle.token(1) inlined
            else:
                handle.token(len(token_ids), start_ns)
        handle.detokenize_ns += share  # RequestHandle.detokenized() inlined
        if output.events is not None and (events := stats_events.get(request_id)) is not None:
            events.fold(output)
        headers = output.trace_headers
        if headers and C.SUMMARY_KEY in headers:  # at the first token (queue, prefill) and at the end (all)
            summary = X.decode_summary(headers)
            if summary is not None:
                API.engine_reports = True
                handle.engine_summary(summary)
        if (request_id in states) if states is not None else (output.finish_reason is None):
            continue  # still open
        del open_requests[request_id]
        _api_finished(handle, output)


def _api_finished(handle: RequestHandle, output: Any) -> None:
    """A request vLLM finished processing (once per request, after its last output)."""
    if (events := API.stats_events.pop(handle.request_id, None)) is not None:
        handle.engine_summary(events.summary())
    elif handle.summary_in is None and API.engine_reports:
        handle.engine_summary({})  # the engine traces this request's phases; never approximate them here
    # No finish reason from the engine but the request is done: vLLM's detokenizer matched a stop string.
    reason = X.finish_reason(output.finish_reason) or semconv.FINISH_STOP
    if reason in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
        handle.aborted(reason=reason)
    else:
        handle.finished(reason)


def process_outputs_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_outputs = binder(positions, "engine_core_outputs")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        # vLLM detokenizes in here: the tokenizer integrations pass through (tokenizer_call()).
        busy = IN_TOKENIZER.set(True)
        try:
            result = original(self, *args, **kwargs)
        finally:
            IN_TOKENIZER.reset(busy)
        if outputs := get_outputs(args, kwargs):
            _api_outputs(self, outputs, start, monotonic_ns())
        return result

    return hook


@guarded("vllm.api.abort")
def _api_aborted(request_ids: Any) -> None:
    for request_id in request_ids or ():
        handle = API.open.get(str(request_id))
        if handle is not None:
            _end_api(handle, reason=semconv.FINISH_ABORT)


def abort_requests_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _api_aborted(result)  # the internal ids vLLM actually aborted
        return result

    return hook


@guarded("vllm.api.error")
def _api_errored(error: Any) -> None:
    for handle in list(API.open.values()):
        _end_api(handle, error if isinstance(error, Exception) else None)


def propagate_error_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_error = binder(positions, "e")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        _api_errored(get_error(args, kwargs))
        return original(self, *args, **kwargs)

    return hook
