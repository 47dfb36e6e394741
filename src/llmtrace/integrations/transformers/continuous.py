"""transformers' continuous batching (``generate_batch``, ``init_continuous_batching``,
``transformers serve --continuous-batching``): its requests and its engine timeline.

A ``ContinuousBatchingManager`` is a continuous-batching engine: a background thread runs
``prepare_next_batch`` (schedule) -> ``_generation_step`` (forward + sampling) ->
``update_batch`` (new tokens, finished requests) over a paged KV cache, and evicts
requests (offloaded to CPU or soft-reset) when the cache runs out. Each manager gets an
:class:`~llmtrace.lifecycle.engine.EngineTracer` (engine id ``hf-cb<n>``):

* a request opens at ``add_request`` on the caller's thread — as a child of the caller's
  span (e.g. the SERVER span of a FastAPI handler) — when its ``RequestState`` is created,
  before the engine thread can see it;
* the engine thread reports the rest: the first step that holds it (``llm.queue`` ->
  ``llm.prefill``), each new token (``update_and_check_completion``), a finish (EOS:
  ``stop``, the token limit: ``length``), a cancel (``abort``), an error (``error``), and an
  eviction (``add_waiting_request`` of a request that had run: a preemption, a second
  ``llm.queue``);
* each step is an ``llm.step`` with ``llm.schedule`` / ``llm.forward`` / ``llm.postprocess``
  and its batch (request ids, prefill and decode tokens, waiting and running counts, the
  paged cache's usage, the prompt tokens its prefix sharing served) —
  in the synchronous mode only: with async batching (CUDA) a step's update handles the
  previous batch's outputs, so steps are not recorded there; requests still are.

With prefix sharing (``allow_block_sharing``, on by default for full-attention models) each
request says how many prompt tokens were served from blocks already in the cache
(``PagedAttentionCache.search_prefix_match``; ``llm.prompt_tokens.cached``), a miss saying 0.

Children of parallel sampling (``num_return_sequences > 1``, ids ``<id>__child#<n>``) are
not separate requests: the parent carries on.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import weakref
from typing import Any, Final

from llmtrace import semconv
from llmtrace._safety import guarded
from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.lifecycle.engine import EngineTracer
from llmtrace.lifecycle.scope import current_scope

API_MODULE: Final = "transformers.generation.continuous_batching.continuous_api"
REQUESTS_MODULE: Final = "transformers.generation.continuous_batching.requests"
SCHEDULER_MODULE: Final = "transformers.generation.continuous_batching.scheduler"
CACHE_MODULE: Final = "transformers.generation.continuous_batching.cache"
#: Optional (older versions lack it): wrapped on its own, outside the all-or-nothing TARGETS.
PREFIX_MATCH: Final = "PagedAttentionCache.search_prefix_match"
MANAGER: Final = "ContinuousBatchingManager"
PROCESSOR: Final = "ContinuousBatchProcessor"

_engines: weakref.WeakKeyDictionary[Any, EngineTracer] = weakref.WeakKeyDictionary()
_engines_lock = threading.Lock()
_engine_numbers = itertools.count()
#: Set by the add_request wrapper while the library builds the request's state on the caller's thread.
_arriving: contextvars.ContextVar[tuple[EngineTracer, int, Any] | None] = contextvars.ContextVar(
    "llmtrace_cb_arriving", default=None)


class _EngineThread(threading.local):
    """What the manager's generation thread is doing, for the hooks that see only a request state."""

    engine: EngineTracer | None = None
    step: Any = None
    #: Prompt tokens served from the prefix cache for the batch being prepared.
    cached_tokens: int = 0


_thread = _EngineThread()


def engine_of(manager: Any) -> EngineTracer:
    """The manager's engine tracer (made on first use)."""
    with _engines_lock:
        engine = _engines.get(manager)
        if engine is None:
            engine = _engines[manager] = EngineTracer(f"hf-cb{next(_engine_numbers)}")
        return engine


def _handle(state: Any) -> Any:
    engine = _thread.engine
    return engine.tracker._open.get(state.request_id) if engine is not None else None


# ----------------------------------------------------------------------------- requests
def add_request_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    engine = _engine_or_none(instance)
    if engine is None:
        return wrapped(*args, **kwargs)
    token = _arriving.set((engine, monotonic_ns(), instance))
    try:
        return wrapped(*args, **kwargs)
    finally:
        _arriving.reset(token)


@guarded("transformers.cb.engine")
def _engine_or_none(manager: Any) -> EngineTracer | None:
    return engine_of(manager)


def state_post_init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    arriving = _arriving.get()
    if arriving is not None:
        _arrived(instance, *arriving)
    return result


@guarded("transformers.cb.arrived")
def _arrived(state: Any, engine: EngineTracer, added_ns: int, manager: Any) -> None:
    if state.request_id in engine.tracker._open:
        return
    model = getattr(manager, "model", None)
    config = getattr(model, "config", None)
    name = getattr(config, "name_or_path", "") or (type(model).__name__ if model is not None else None)
    # In a server call (FastAPI, aiohttp, gRPC) the request arrived with the call, and the
    # prompt encode the handler did before add_request is its llm.tokenize; it queues from here.
    scope = current_scope()
    arrival_ns = scope.arrival_ns if scope is not None and not scope.closed else added_ns
    handle = engine.tracker.add(state.request_id, arrival_ns=arrival_ns, queued_ns=added_ns, model=name,
                                prompt_tokens=len(state.initial_tokens), max_tokens=state.max_new_tokens,
                                stream=bool(state.streaming))
    if scope is not None and not scope.closed:
        scope.adopt_pending(handle)


def update_and_check_completion_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...],
                                        kwargs: dict[str, Any]) -> Any:
    generated = len(getattr(instance, "generated_tokens", ()))
    finished = wrapped(*args, **kwargs)
    if _thread.engine is not None:
        _token_event(instance, generated, bool(finished))
    return finished


@guarded("transformers.cb.token")
def _token_event(state: Any, generated_before: int, finished: bool) -> None:
    handle = _handle(state)
    if handle is None:
        return
    if len(state.generated_tokens) > generated_before:
        handle.token()
    if finished:
        eos = bool(state.generated_tokens) and state.generated_tokens[-1] in state._eos_token_ids
        engine = _thread.engine
        assert engine is not None
        # No output_tokens= from the state: after a soft reset its generated_tokens restart from
        # zero (the earlier ones became prompt); the handle counted every token event.
        engine.tracker.finished(state.request_id, semconv.FINISH_STOP if eos else semconv.FINISH_LENGTH)


def add_waiting_request_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    if _thread.engine is not None and args:
        _requeued(args[0])
    return result


@guarded("transformers.cb.requeued")
def _requeued(state: Any) -> None:
    handle = _handle(state)
    if handle is not None and handle.scheduled_ns and not handle.awaiting_schedule:
        handle.preempted()  # evicted (offloaded or soft-reset) after it had run: it waits again


def clear_cancelled_requests_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...],
                                     kwargs: dict[str, Any]) -> Any:
    cancelled = wrapped(*args, **kwargs)
    if _thread.engine is not None and cancelled:
        for state in cancelled:
            _ended(state, None)
    return cancelled


def handle_request_error_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    if _thread.engine is not None and len(args) >= 2:
        _ended(args[1], args[0] if isinstance(args[0], BaseException) else None)
    return result


@guarded("transformers.cb.ended")
def _ended(state: Any, error: BaseException | None) -> None:
    """Cancelled (no *error*: ``abort``) or failed (``error``)."""
    engine = _thread.engine
    if engine is not None:
        engine.tracker.aborted(state.request_id, error, None if error is not None else semconv.FINISH_ABORT)


# ----------------------------------------------------------------------------- the engine thread
def generation_loop_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    engine = _engine_or_none(instance)
    if engine is None:
        return wrapped(*args, **kwargs)
    _thread.engine, _thread.step = engine, None
    try:
        return wrapped(*args, **kwargs)
    finally:
        _thread.engine = None
        _stopped(engine)


@guarded("transformers.cb.stopped")
def _stopped(engine: EngineTracer) -> None:
    engine.flush_window()
    engine.tracker.abort_all()  # requests the loop left unfinished (a hard stop)


def prepare_next_batch_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    start = monotonic_ns()
    _thread.cached_tokens = 0
    ready = wrapped(*args, **kwargs)
    if _thread.engine is not None:
        _scheduled(instance, bool(ready), start, monotonic_ns())
    return ready


def prefix_match_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    matched = wrapped(*args, **kwargs)
    if _thread.engine is not None:
        _prefix_matched(args[0] if args else kwargs.get("request_id"), matched)
    return matched


@guarded("transformers.cb.prefix_match")
def _prefix_matched(request_id: Any, matched: Any) -> None:
    # A match moves the request into the batch being prepared; no match (0) may be retried on a
    # later step, so a miss is recorded when the request's first prefill is scheduled (_scheduled).
    if not isinstance(matched, int) or matched <= 0:
        return
    engine = _thread.engine
    handle = engine.tracker._open.get(request_id) if engine is not None else None
    if handle is not None:
        handle.prompt_cached(matched)
        _thread.cached_tokens += matched


@guarded("transformers.cb.schedule")
def _scheduled(processor: Any, ready: bool, start_ns: int, end_ns: int) -> None:
    engine = _thread.engine
    assert engine is not None
    if not ready:
        engine.idle()
        return
    futures = getattr(processor.inputs_and_outputs, "requests_in_batch", None)
    if getattr(processor, "use_async_batching", False) or futures is None:
        return  # async batching: this step's update is the previous batch's (module docstring)
    step = engine.begin_step()
    step.start_ns = start_ns
    step.add_phase("schedule", start_ns, end_ns)
    known = engine.tracker._open
    sharing = bool(getattr(getattr(processor, "cache", None), "use_prefix_sharing", False))
    ids, prefill, decode = [], 0, 0
    for future in futures:
        state = future.state
        handle = known.get(state.request_id)
        if handle is not None:
            ids.append(state.request_id)
        if state.generated_tokens:  # it has output: this step decodes its next token
            decode += int(future.query_length)
        else:  # (chunked) prefill, also of a soft-reset request re-reading its output as prompt
            prefill += int(future.query_length)
            if sharing and handle is not None and handle.prompt_cache is None:
                handle.prompt_cached(0)  # scheduled without a prefix match: a miss
    scheduler = processor.scheduler
    step.batch(ids, prefill_tokens=prefill, decode_tokens=decode,
               waiting=len(scheduler.waiting_requests), running=len(scheduler.active_requests),
               kv_cache_usage=_kv_cache_usage(processor), cached_tokens=_thread.cached_tokens)
    _thread.step = step


def _kv_cache_usage(processor: Any) -> float | None:
    """Share of the paged cache in use after this step's allocation (None where it cannot say)."""
    free = getattr(getattr(processor, "cache", None), "compute_free_capacity", None)
    if free is None:
        return None
    try:
        return max(0.0, min(1.0, 1.0 - float(free(relative=True))))
    except (TypeError, ValueError, ZeroDivisionError, AttributeError):
        return None


def generation_step_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    start = monotonic_ns()
    result = wrapped(*args, **kwargs)
    step = _thread.step
    if step is not None:
        step.add_phase("forward", start, monotonic_ns())
    return result


def update_batch_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    start = monotonic_ns()
    try:
        return wrapped(*args, **kwargs)
    finally:
        step, _thread.step = _thread.step, None
        if step is not None and _thread.engine is not None:
            _end_step(_thread.engine, step, start)


@guarded("transformers.cb.end_step")
def _end_step(engine: EngineTracer, step: Any, postprocess_start_ns: int) -> None:
    step.add_phase("postprocess", postprocess_start_ns, monotonic_ns())
    engine.end_step(step)


TARGETS: Final = (
    (API_MODULE, f"{MANAGER}.add_request", add_request_wrapper),
    (API_MODULE, f"{MANAGER}._run_generation_loop", generation_loop_wrapper),
    (API_MODULE, f"{PROCESSOR}.prepare_next_batch", prepare_next_batch_wrapper),
    (API_MODULE, f"{PROCESSOR}._generation_step", generation_step_wrapper),
    (API_MODULE, f"{PROCESSOR}.update_batch", update_batch_wrapper),
    (API_MODULE, f"{PROCESSOR}._handle_request_error", handle_request_error_wrapper),
    (REQUESTS_MODULE, "RequestState.__post_init__", state_post_init_wrapper),
    (REQUESTS_MODULE, "RequestState.update_and_check_completion", update_and_check_completion_wrapper),
    (SCHEDULER_MODULE, "Scheduler.add_waiting_request", add_waiting_request_wrapper),
    (SCHEDULER_MODULE, "Scheduler.clear_cancelled_requests", clear_cancelled_requests_wrapper),
)
