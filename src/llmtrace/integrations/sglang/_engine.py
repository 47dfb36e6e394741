"""Scheduler side of the SGLang adapter: the step timeline and the engine half of each request.

``Scheduler.handle_generate_request`` opens the engine record (a child of the HTTP
server's ``llm.request`` through the carrier on the request's time stats);
``get_next_batch_to_run`` is a step's ``llm.schedule`` and its batch; ``run_batch`` its
``llm.forward``; ``process_batch_result`` its ``llm.postprocess``. Under overlap
scheduling SGLang runs batch N+1 before it processes batch N's result (on a copy of the
batch), so a step is keyed by the batch until ``run_batch`` returns and by the result
after. The output streamer (called inside ``process_batch_result``, and for requests the
scheduler ends early) ends the finished requests and, before the message leaves, puts the
engine's durations on the request's time stats for the HTTP server; it counts each
request's new tokens itself in prefill steps, while a decode step gives every request of its
batch one token in one pass after the step.
``ScheduleBatch.retract_decode`` is preemption: the retracted requests queue again.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from llmtrace import semconv
from llmtrace._safety import guarded
from llmtrace.integrations._targets import Hook, binder, number
from llmtrace.integrations.sglang import _constants as C
from llmtrace.integrations.sglang import extractors as X
from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.lifecycle.engine import EngineTracer, StepRecord
from llmtrace.lifecycle.request import RequestHandle
from llmtrace.lifecycle.tracker import RequestTracker


class _EngineState:
    """One Scheduler's timeline and the engine half of its requests."""

    def __init__(self, scheduler: Any) -> None:
        dp_rank, tp_rank, tp_size = _ranks(scheduler)
        self.tracker = RequestTracker()
        self.tracer = EngineTracer(X.engine_id(dp_rank, tp_rank, tp_size), self.tracker)
        self.handles: dict[str, RequestHandle] = {}
        #: Every TP rank runs the same schedule: only the first records the requests' phases
        #: (each rank keeps its own engine timeline, for GPU idle per device).
        self.tracks_requests = not tp_rank
        self.preempted = 0  # retracted since the last step began
        #: Each open request's prefix-cache hits counted so far (SGLang's ``req.cached_tokens``
        #: grows when a prefill, or its first chunk, reads a prefix from the radix cache).
        self.cached_seen: dict[str, int] = {}


def _ranks(scheduler: Any) -> tuple[Any, Any, Any]:
    tp_size = getattr(scheduler, "tp_size", 1)
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return (getattr(parallel, "dp_rank", None), getattr(parallel, "tp_rank", None),
                getattr(parallel, "tp_size", tp_size))
    except Exception:  # noqa: BLE001 - ranks unknown (an SGLang without the context): dp0
        return None, None, tp_size


class _Pending:
    """A step between ``get_next_batch_to_run`` and ``process_batch_result``."""

    __slots__ = ("decoding", "key", "state", "step")

    def __init__(self, key: Any, step: StepRecord, state: _EngineState, decoding: bool) -> None:
        self.key = key  # held so that id(key) stays unique while pending
        self.step = step
        self.state = state
        #: A decode batch without speculative decoding: exactly one new token per request.
        self.decoding = decoding


_ENGINES: weakref.WeakKeyDictionary[Any, _EngineState] = weakref.WeakKeyDictionary()
_PENDING: dict[int, _Pending] = {}
#: The scheduler of this process (SGLang runs one per process) for the hooks that do not see it:
#: the output streamer and ``ScheduleBatch.retract_decode``.
_CURRENT: list[_EngineState] = []
#: True while ``process_batch_result`` of a decode step runs (the output streamer's fast path).
_DECODING: list[bool] = []


def _state(scheduler: Any) -> _EngineState:
    state = _ENGINES.get(scheduler)
    if state is None:
        state = _ENGINES[scheduler] = _EngineState(scheduler)
        _CURRENT[:] = [state]
    return state


def reset() -> None:
    """Close every open window and forget pending steps (``uninstrument()``)."""
    for state in list(_ENGINES.values()):
        state.tracer.flush_window()
    _PENDING.clear()
    _CURRENT.clear()


def engine_states() -> list[Any]:
    """The engine states of this process (for tests and ``flush``)."""
    return list(_ENGINES.values())


def _remember(key: Any, pending: _Pending) -> None:
    if len(_PENDING) >= C.MAX_PENDING_STEPS:
        _PENDING.pop(next(iter(_PENDING)))
    pending.key = key
    _PENDING[id(key)] = pending


def _take(key: Any) -> _Pending | None:
    pending = _PENDING.pop(id(key), None)
    return pending if pending is not None and pending.key is key else None


# --------------------------------------------------------------------------- requests
@guarded("sglang.engine.add_request")
def _engine_add(scheduler: Any, recv_req: Any, arrival_ns: int) -> None:
    state = _state(scheduler)
    request_id, prompt_tokens, params = X.engine_request(recv_req)
    if not state.tracks_requests or not request_id or request_id in state.handles:
        return
    carried = X.carried(getattr(recv_req, "time_stats", None))
    state.handles[request_id] = state.tracker.add(
        request_id, carrier=X.carrier(carried), arrival_ns=arrival_ns, prompt_tokens=prompt_tokens,
        max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
        stream=params.stream, attributes={semconv.GEN_AI_SYSTEM: "sglang"})


def handle_generate_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_request = binder(positions, "recv_req")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Opened before SGLang handles it: a request SGLang rejects at once (too long, queue full)
        # is ended inside the call, through the output streamer or ``send_abort_output``.
        recv_req = get_request(args, kwargs)
        _engine_add(self, recv_req, monotonic_ns())
        try:
            return original(self, *args, **kwargs)
        except BaseException:
            _ended_early(recv_req)
            raise

    return hook


@guarded("sglang.engine.outputs")
def _outputs(reqs: Any) -> None:
    """Before SGLang sends a step's outputs: the requests that finished, and (outside decode steps)
    each request's new tokens, so that the first-token and final durations ride on this message."""
    if not _CURRENT or not _CURRENT[0].handles:
        return
    state = _CURRENT[0]
    handles = state.handles
    now = monotonic_ns()
    if _DECODING:
        # A decode step (the common case): one token per running request, recorded for the whole
        # batch after the step (``_processed``); here only the requests that finished.
        for req in reqs or ():
            # ``req.finished()`` is exactly this test; inlined: it runs for every request every step.
            if req.finished_reason is not None and (handle := handles.get(req.rid)) is not None:
                _finished(state, handle, req, now)
        return
    for req in reqs or ():
        handle = handles.get(req.rid)
        if handle is None:
            continue
        produced = len(req.output_ids) - handle.output_tokens
        if produced > 0:
            first = not handle.token_ns
            handle.token(produced, now)
            if first and not req.finished():
                # Queue and prefill are known at the first token: send them now, so that a request
                # the HTTP server ends itself (a client disconnect) still gets them.
                X.carry(req.time_stats, summary=X.first_token_summary(handle.first_token_summary()))
        if req.finished():
            _finished(state, handle, req, now)


def _finished(state: _EngineState, handle: RequestHandle, req: Any, now: int) -> None:
    request_id = req.rid
    del state.handles[request_id]
    state.cached_seen.pop(request_id, None)
    produced = len(req.output_ids) - handle.output_tokens
    if produced > 0:
        handle.token(produced, now)
    reason = X.finish_reason(req.finished_reason) or semconv.FINISH_STOP
    if reason in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
        summary = state.tracker.aborted(request_id, reason=reason)
    else:
        summary = state.tracker.finished(request_id, reason, at_ns=now)
    X.carry(req.time_stats, summary=summary)


def stream_output_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_reqs = binder(positions, "reqs")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        _outputs(get_reqs(args, kwargs))
        return original(self, *args, **kwargs)

    return hook


@guarded("sglang.engine.abort")
def _ended_early(req: Any) -> None:
    """A request the scheduler ended outside the output stream (aborted while queued, rejected)."""
    for state in _CURRENT:
        state.cached_seen.pop(str(getattr(req, "rid", "")), None)
        if state.handles.pop(str(getattr(req, "rid", "")), None) is not None:
            state.tracker.aborted(req.rid, reason=semconv.FINISH_ABORT)


def send_abort_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_req = binder(positions, "req")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        _ended_early(get_req(args, kwargs))
        return original(self, *args, **kwargs)

    return hook


@guarded("sglang.engine.retract")
def _retracted(result: Any) -> None:
    retracted = result[0] if isinstance(result, tuple) and result else ()
    if not _CURRENT or not retracted:
        return
    state = _CURRENT[0]
    now = monotonic_ns()
    for req in retracted:
        handle = state.handles.get(req.rid)
        if handle is not None:
            handle.preempted(now)
    state.preempted += len(retracted)


def retract_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _retracted(result)
        return result

    return hook


# --------------------------------------------------------------------------- steps
@guarded("sglang.engine.scheduled")
def _scheduled(scheduler: Any, plan: Any, start_ns: int, end_ns: int) -> None:
    state = _state(scheduler)
    batch = getattr(plan, "batch_to_run", None)
    if batch is None:
        if not _PENDING:
            # Nothing to run and nothing in flight: close the window now, or its steps would
            # wait for the next request.
            state.tracer.flush_window()
        return
    step = state.tracer.begin_step()
    step.start_ns = start_ns
    step.add_phase("schedule", start_ns, end_ns)
    info = X.batch_info(batch)
    # The tracker knows every request of the batch (it opened each one as it arrived); a rank that
    # does not track requests links none.
    request_ids = info.request_ids if state.tracks_requests else ()
    # Counted in every step: the map of what each request has read from the cache moves on.
    cached_tokens = _new_cache_hits(state, batch) if info.mode != "decode" else 0
    if step.sampled:
        running = getattr(getattr(plan, "running_batch", None), "reqs", None)
        step.batch(request_ids, prefill_tokens=info.prefill_tokens, decode_tokens=info.decode_tokens,
                   waiting=len(getattr(scheduler, "waiting_queue", ()) or ()),
                   running=len(running) if running is not None else None,
                   kv_cache_usage=X.kv_cache_usage(getattr(scheduler, "token_to_kv_pool_allocator", None),
                                                   getattr(scheduler, "tree_cache", None)),
                   preempted=state.preempted, cached_tokens=cached_tokens)
        step.set(semconv.LLM_BATCH_FORWARD_MODE, info.mode)
    else:
        # An unsampled window's step feeds only its requests' timelines and the batch-size metric:
        # queue lengths, KV usage and the forward mode would go unread.
        step.batch_requests(request_ids, state.preempted)
    state.preempted = 0
    _remember(batch, _Pending(batch, step, state, info.mode == "decode" and X.one_token_per_step(batch)))


def _new_cache_hits(state: _EngineState, batch: Any) -> int:
    """Prompt tokens this prefill step read from the radix cache: the growth of each request's
    ``cached_tokens`` since the last step (SGLang counts it as it prepares the extend batch, once
    per request: not on later chunks, not after a retraction)."""
    hits = 0
    seen, handles = state.cached_seen, state.handles
    for req in getattr(batch, "reqs", None) or ():
        cached = number(getattr(req, "cached_tokens", None), int) or 0
        before = seen.get(req.rid, 0)
        # Only requests this rank tracks: their entry goes when they end (a bounded map).
        if cached > before and req.rid in handles:
            hits += cached - before
            seen[req.rid] = cached
    return hits


def get_next_batch_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        plan = original(self, *args, **kwargs)
        _scheduled(self, plan, start, monotonic_ns())
        return plan

    return hook


@guarded("sglang.engine.forward")
def _forward_started(batch: Any) -> _Pending | None:
    pending = _take(batch)
    if pending is not None:
        pending.step.mark("forward")  # a mark: CUDA-event timing of the forward where torch uses CUDA
    return pending


@guarded("sglang.engine.forward_done")
def _forward_done(pending: _Pending, result: Any) -> None:
    pending.step.mark(None)
    _remember(result, pending)


def run_batch_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_batch = binder(positions, "batch")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _forward_started(get_batch(args, kwargs))
        result = original(self, *args, **kwargs)
        if pending is not None:
            _forward_done(pending, result)
        return result

    return hook


@guarded("sglang.engine.processed")
def _processed(pending: _Pending, start_ns: int, end_ns: int) -> None:
    step = pending.step
    if pending.decoding:
        step.tokens()  # one token for each request of the batch still running (finished ones are ended)
    step.add_phase("postprocess", start_ns, end_ns)
    pending.state.tracer.end_step(step)


def process_result_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_result = binder(positions, "result")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _take(get_result(args, kwargs))
        start = monotonic_ns()
        decoding = pending is not None and pending.decoding
        if decoding:
            _DECODING.append(True)
        try:
            result = original(self, *args, **kwargs)
        finally:
            if decoding:
                _DECODING.pop()
        if pending is not None:
            _processed(pending, start, monotonic_ns())
        return result

    return hook
