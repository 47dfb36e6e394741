"""EngineCore side of the vLLM adapter: the step timeline and the engine half of each request.

``Scheduler.add_request`` opens the engine record (a child of the API server's
``llm.request`` through ``trace_headers``; none for an unsampled request whose metrics the API
server takes from vLLM's own request events, ``C.NO_ENGINE_RECORD_KEY``);
``Scheduler.schedule`` begins an ``llm.step`` keyed by its ``SchedulerOutput``; the executor's
``execute_model`` marks the forward dispatch; ``Scheduler.update_from_output`` closes the step,
counts tokens and sends the engine's durations back on the outputs' ``trace_headers``. A step of
an unsampled window while no request has a record here is handed to the engine tracer's compiled
counter first (``EngineTracer.attach_counter``), which counts it without Python work.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from llmtrace import semconv
from llmtrace._safety import guarded, record_error
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm import extractors as X
from llmtrace.integrations.vllm._binding import Hook, binder
from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.lifecycle.engine import MAX_BATCH_IDS_ATTR, EngineTracer, StepRecord, note_batch
from llmtrace.lifecycle.request import RequestHandle
from llmtrace.lifecycle.tracker import RequestTracker


# --------------------------------------------------------------------------- EngineCore side
class _EngineState:
    """One Scheduler's timeline and the engine half of its requests."""

    def __init__(self, scheduler: Any) -> None:
        config = getattr(scheduler, "vllm_config", None)
        self.model = X.model_name(config)
        self.tracker = RequestTracker()
        self.tracer = EngineTracer(X.engine_id(config), self.tracker)
        self.handles: dict[str, RequestHandle] = {}
        #: The compiled counter of the unsampled windows' steps while no request has a record here
        #: (None: not built); the per-step hooks hand it each step first.
        self.counter = self.tracer.attach_counter(self.handles, "num_scheduled_tokens", "requests",
                                                  C.MAX_PENDING_STEPS)


class _Pending:
    """A step between ``schedule()`` and ``update_from_output()`` (several overlap with async scheduling):
    its record, or (a step of an unsampled window, counted without one) its start and batch size."""

    __slots__ = ("forward_start_ns", "output", "schedule_end_ns", "size", "start_ns", "state", "step")

    def __init__(self, output: Any, step: StepRecord | None, state: _EngineState, start_ns: int,
                 schedule_end_ns: int, size: int = 0) -> None:
        self.output = output  # held so that id(output) stays unique while pending
        self.step = step
        self.state = state
        self.start_ns = start_ns
        self.schedule_end_ns = schedule_end_ns
        self.size = size
        self.forward_start_ns: int | None = None


_ENGINES: weakref.WeakKeyDictionary[Any, _EngineState] = weakref.WeakKeyDictionary()
_PENDING: dict[int, _Pending] = {}


#: The scheduler seen last and its state: a process runs one scheduler as a rule, and the weak
#: dictionary's ``get`` is two Python frames, asked three or four times a step.
_last: tuple[weakref.ref[Any], _EngineState] | None = None
#: The step counter the per-step hooks ask first: the one of the scheduler seen last, unless another
#: scheduler's still holds steps (those must come back to it). It checks that a step is its
#: scheduler's, so another scheduler's steps go the Python way, correctly.
_counter: Any = None


def _state(scheduler: Any) -> _EngineState:
    global _last, _counter
    last = _last
    if last is not None and last[0]() is scheduler:
        return last[1]
    state = _ENGINES.get(scheduler)
    if state is None:
        state = _ENGINES[scheduler] = _EngineState(scheduler)
    _last = (weakref.ref(scheduler), state)
    if _counter is None or not _counter.pending():
        _counter = state.counter
    return state


def reset() -> None:
    """Close every open window and forget pending steps (``uninstrument()``)."""
    global _last, _counter
    for state in list(_ENGINES.values()):
        state.tracer.flush_window()
    _PENDING.clear()
    _last = _counter = None


def engine_states() -> list[Any]:
    """The engine states of this process (for tests and ``flush``)."""
    return list(_ENGINES.values())


@guarded("vllm.engine.add_request")
def _engine_add(scheduler: Any, request: Any) -> None:
    headers = getattr(request, "trace_headers", None)
    if headers and C.NO_ENGINE_RECORD_KEY in headers:
        # Unsampled, and the API server has its metrics from vLLM's own events: nothing to keep. Where the
        # mark is all the headers hold (vLLM's own tracing off), the request's outputs carry none back.
        if len(headers) == 1:
            request.trace_headers = None
        return
    state = _state(scheduler)
    params = X.request_params(request)
    if not params.request_id or params.request_id in state.handles:
        return
    carrier = X.carrier_from(headers)
    state.handles[params.request_id] = state.tracker.add(
        params.request_id, carrier=carrier, arrival_ns=monotonic_ns(), model=state.model,
        prompt_tokens=params.prompt_tokens, max_tokens=params.max_tokens, temperature=params.temperature,
        top_p=params.top_p, attributes={semconv.GEN_AI_SYSTEM: "vllm"})


def add_request_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_request = binder(positions, "request")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _engine_add(self, get_request(args, kwargs))
        return result

    return hook


# The per-step hooks below guard their work with try/except in place rather than calling
# ``@guarded`` functions: a decorated call costs about twice a plain one, and they run three
# times a step. Whatever fails is counted at the same sites and vLLM's step goes on.
def _engine_scheduled(scheduler: Any, state: _EngineState, step: StepRecord, output: Any, end_ns: int) -> None:
    """A step with a record: a sampled window's gets the batch's numbers for its ``llm.step`` span."""
    step.phases.append(("schedule", step.start_ns, end_ns))  # StepRecord.add_phase inlined
    handles = state.handles
    if not step.sampled:  # kept for per-request energy only: its requests' step records are all it needs
        scheduled = getattr(output, "num_scheduled_tokens", None) or ()
        records, preempted_count = _records_in_batch(handles, output, scheduled, end_ns)
        step.batch_handles(records, preempted_count, len(scheduled))
        _add_pending(_Pending(output, step, state, step.start_ns, end_ns))
        return
    info = X.batch_info(output, getattr(scheduler, "requests", None) or {})
    scheduled, preempted = info.request_ids, info.preempted_ids
    _note_preempted(handles, preempted, end_ns)
    waiting, running = X.queue_counts(scheduler.get_request_counts())
    known = [rid for rid in scheduled if rid in handles]
    step.batch(known, prefill_tokens=info.prefill_tokens,
               decode_tokens=info.decode_tokens, waiting=waiting, running=running,
               kv_cache_usage=X.kv_cache_usage(scheduler.get_kv_cache_usage()), preempted=len(preempted),
               cached_tokens=info.cached_tokens, size=len(scheduled))
    if len(known) != len(scheduled):  # requests EngineCore keeps no record of are in the batch too
        step.set(semconv.LLM_BATCH_REQUEST_IDS, list(scheduled[:MAX_BATCH_IDS_ATTR]))
    _add_pending(_Pending(output, step, state, step.start_ns, end_ns))


def _engine_counted(state: _EngineState, output: Any, start_ns: int, end_ns: int) -> None:
    """A step of an unsampled window: no record (``EngineTracer.count_step``). It feeds only the
    batch-size histogram, the idle ratio and its requests' timelines; the prefill/decode split, queue
    counts and KV usage (a pass over the batch and two calls into the scheduler) would go unread."""
    scheduled = getattr(output, "num_scheduled_tokens", None) or ()
    step_id = state.tracer.next_step_id()
    if handles := state.handles:  # none open: the common step at production sampling, vLLM's stats on
        note_batch(_records_in_batch(handles, output, scheduled, end_ns)[0], step_id, start_ns)
    _add_pending(_Pending(output, None, state, start_ns, end_ns, len(scheduled)))


def _records_in_batch(handles: dict[str, RequestHandle], output: Any, scheduled: Any,
                      at_ns: int) -> tuple[list[RequestHandle], int]:
    """A step of an unsampled window read for its records alone: the open records of the requests
    *scheduled* (found as the batch is read, not listed by id and looked up again), with the batch's
    preemptions noted on theirs; and how many requests were preempted."""
    preempted = getattr(output, "preempted_req_ids", None) or ()
    _note_preempted(handles, preempted, at_ns)
    get = handles.get
    return [handle for rid in scheduled if (handle := get(rid)) is not None], len(preempted)


def _note_preempted(handles: dict[str, RequestHandle], preempted: Any, at_ns: int) -> None:
    get = handles.get
    for request_id in preempted:
        handle = get(request_id)
        if handle is not None:
            handle.preempted(at_ns)


def _add_pending(pending: _Pending) -> None:
    if len(_PENDING) >= C.MAX_PENDING_STEPS:
        _PENDING.pop(next(iter(_PENDING)))
    _PENDING[id(pending.output)] = pending


def _engine_schedule(scheduler: Any, output: Any, start_ns: int, end_ns: int) -> None:
    """A step the compiled counter did not take (or none is built): recorded, or counted here."""
    state = _state(scheduler)
    tracer = state.tracer
    tracer.settle_counter()  # the steps it counted so far go first: the window's counts and ids in order
    if tracer.needs_step_record(start_ns, bool(state.handles)):
        _engine_scheduled(scheduler, state, tracer.begin_step(start_ns), output, end_ns)
        return
    _engine_counted(state, output, start_ns, end_ns)
    if not state.handles:  # the window's next steps need nothing of Python: the counter may take them
        tracer.allow_counter(scheduler)


def schedule_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        output = original(self, *args, **kwargs)
        end = monotonic_ns()
        try:
            counter = _counter
            if counter is None or not counter.scheduled(self, output, start, end):
                _engine_schedule(self, output, start, end)
        except Exception as exc:  # noqa: BLE001 - see above
            record_error("vllm.engine.scheduled", exc)
        return output

    return hook


def execute_model_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_output = binder(positions, "scheduler_output")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = get_output(args, kwargs)
        counter = _counter
        if counter is None or not counter.dispatched(output, monotonic_ns()):
            pending = _PENDING.get(id(output))
            if pending is not None and pending.forward_start_ns is None:
                pending.forward_start_ns = monotonic_ns()
        return original(self, *args, **kwargs)

    return hook


def _engine_updated(scheduler: Any, pending: _Pending | None, result: Any,
                    start_ns: int, end_ns: int) -> None:
    state = pending.state if pending is not None else _state(scheduler)
    handles = state.handles
    if handles:  # no record open here, no output to read (the common step at production sampling)
        _engine_outputs(state, pending, result, start_ns)
    if pending is not None:
        # Dispatch -> outputs back in EngineCore: the forward pass and sampling, as the engine sees them.
        forward_start = pending.forward_start_ns or pending.schedule_end_ns
        step = pending.step
        if step is None:
            state.tracer.count_step(pending.start_ns, end_ns, pending.size, start_ns - forward_start)
        else:
            phases = step.phases  # StepRecord.add_phase inlined
            phases.append(("forward", forward_start, start_ns))
            phases.append(("postprocess", start_ns, end_ns))
            state.tracer.end_step(step)
    if not handles and not getattr(scheduler, "requests", None) and not scheduler.has_requests():
        # The engine goes idle: close the window now, or its steps would wait for the next request.
        # (Asked of the scheduler, a chain of four calls, only once neither a request open here nor
        # one in its own table of requests is left.)
        state.tracer.flush_window()


def _engine_outputs(state: _EngineState, pending: _Pending | None, result: Any, start_ns: int) -> None:
    """The step's outputs for the requests with a record here: tokens, first outputs, finishes."""
    handles = state.handles
    # Draft tokens per request, when speculative decoding runs (empty otherwise: one test per step).
    drafts = getattr(pending.output, "scheduled_spec_decode_tokens", None) if pending is not None else None
    for output in X.engine_outputs(result):
        # Per request per step: keep this loop free of helper calls on the common (decode) path.
        handle = handles.get(output.request_id)
        if handle is None:
            continue
        token_ids = output.new_token_ids
        if (output.finish_reason is None and handle.token_ns and len(token_ids or ()) == 1 and not drafts
                and handle.finish_ns is None):
            handle.token_ns.append(start_ns)  # RequestHandle.token(1) inlined: a running request's next token
            continue
        first = not handle.token_ns
        if token_ids:
            handle.token(len(token_ids), start_ns)
            if first:
                _first_output(handle, output)
            if drafts and (proposed := drafts.get(output.request_id)):
                # vLLM's own accounting: every accepted draft token plus one bonus token come back.
                handle.speculated(len(proposed), max(0, len(token_ids) - 1))
        if output.finish_reason is None:
            if first and token_ids:
                # Queue and prefill are known at the first token: send them now, so that a request
                # the API server ends itself (a stop string) still gets them.
                output.trace_headers = X.with_summary(output.trace_headers,
                                                      X.first_token_summary(handle.first_token_summary()))
            continue
        _engine_finished_output(state, output)


def _first_output(handle: RequestHandle, output: Any) -> None:
    """Once per request: where its prompt's KV came from (vLLM's PrefillStats ride on the first output)."""
    cache = X.prefill_cache(getattr(output, "prefill_stats", None))
    if cache is not None:
        handle.prompt_cached(*cache)


def _engine_finished_output(state: _EngineState, output: Any) -> None:
    request_id = output.request_id
    del state.handles[request_id]
    reason = X.finish_reason(output.finish_reason) or semconv.FINISH_STOP
    if reason in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
        summary = state.tracker.aborted(request_id, reason=reason)
    else:
        summary = state.tracker.finished(request_id, reason)
    output.trace_headers = X.with_summary(output.trace_headers, summary)


def update_from_output_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_output = binder(positions, "scheduler_output")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        scheduler_output = get_output(args, kwargs)
        result = original(self, *args, **kwargs)
        try:
            counter = _counter
            settle = None if counter is None else counter.updated(self, scheduler_output, start, monotonic_ns())
            if settle is None:  # not a step the counter took
                pending = _PENDING.pop(id(scheduler_output), None)
                if pending is not None and pending.output is not scheduler_output:
                    pending = None  # another object at a recycled address: not this step's
                _engine_updated(self, pending, result, start, monotonic_ns())
            elif settle:  # counted; its window may be due to close, a record opened, or the engine idle
                _state(self).tracer.settle_counter()
                _engine_updated(self, None, result, start, monotonic_ns())
        except Exception as exc:  # noqa: BLE001 - see above
            record_error("vllm.engine.updated", exc)
        return result

    return hook


@guarded("vllm.engine.finished")
def _engine_finished(scheduler: Any, requests: Any, status: Any) -> None:
    state = _state(scheduler)
    reason = semconv.FINISH_ERROR if "ERROR" in str(status).upper() else semconv.FINISH_ABORT
    for request in requests or ():
        request_id = str(getattr(request, "request_id", ""))
        if state.handles.pop(request_id, None) is not None:
            state.tracker.aborted(request_id, reason=reason)


def finish_requests_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_status = binder(positions, "finished_status")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _engine_finished(self, result, get_status(args, kwargs))
        return result

    return hook
