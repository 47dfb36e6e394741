"""Wiring of the vLLM adapter: the wrappers, and the all-or-nothing target check.

Every wrapper calls vLLM first-class: it takes a timestamp, calls through, and
hands the objects to a ``@guarded`` helper that reads them (through
:mod:`.extractors`) into the lifecycle API. vLLM's own exceptions pass through
untouched; an llmtrace error is logged once and counted, never raised.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wrapt
from opentelemetry import trace

from llmtrace import semconv
from llmtrace._safety import guarded, warn_once
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm import extractors as X
from llmtrace.lifecycle.clock import monotonic_ns, to_mono_ns
from llmtrace.lifecycle.engine import EngineTracer, StepRecord
from llmtrace.lifecycle.request import RequestHandle, start_request
from llmtrace.lifecycle.tracker import RequestTracker

log = logging.getLogger("llmtrace")

_Wrapper = Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]


# --------------------------------------------------------------------------- target check
@dataclass(frozen=True)
class Checked:
    """A target that passed the check: its parameters' positions (``self`` not counted)."""

    target: C.Target
    positions: dict[str, int]


def check_targets(targets: tuple[C.Target, ...] = C.TARGETS) -> tuple[list[Checked], list[str]]:
    """Import every target module and check each method and its named parameters.

    Returns the checked targets and one line per problem; any problem means the
    adapter stays off.
    """
    checked: list[Checked] = []
    problems: list[str] = []
    for target in targets:
        where = f"{target.module}.{target.path}"
        try:
            importlib.import_module(target.module)
            _parent, _attribute, original = wrapt.resolve_path(target.module, target.path)
            parameters = list(inspect.signature(original).parameters)
        except Exception as exc:  # noqa: BLE001 - a missing module/attribute is what we report
            problems.append(f"{where}: not found ({type(exc).__name__}: {exc})")
            continue
        if parameters and parameters[0] == "self":
            parameters = parameters[1:]
        missing = [name for name in target.params if name not in parameters]
        if missing:
            problems.append(f"{where}: parameter(s) {', '.join(missing)} not in ({', '.join(parameters)})")
            continue
        checked.append(Checked(target, {name: parameters.index(name) for name in target.params}))
    return checked, problems


def _binder(positions: dict[str, int], name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """Read argument *name* by the position the signature gave it, or by keyword (no per-call bind)."""
    index = positions[name]

    def get(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[index] if index < len(args) else None

    return get


# --------------------------------------------------------------------------- tokenizer nesting
def _tokenizer_scope() -> contextlib.AbstractContextManager[Any]:
    """Inside a render/detokenize, the tokenizers/transformers integrations pass through:
    the request's ``llm.tokenize`` is this adapter's, measured around vLLM's renderer."""
    try:
        from llmtrace.integrations._common import tokenizer_call
    except ImportError:
        return contextlib.nullcontext()
    scope: contextlib.AbstractContextManager[Any] = tokenizer_call()
    return scope


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


class _ApiState:
    """Open request records of this process's OutputProcessors, keyed by vLLM's internal id."""

    def __init__(self) -> None:
        self.open: dict[str, RequestHandle] = {}
        self.model: str | None = None
        #: Set once an engine summary arrived: the engine side is traced, so the API side
        #: must not approximate queue/prefill/decode itself (the engine's spans are in the trace).
        self.engine_reports = False

    def reset(self) -> None:
        self.open.clear()
        self.engine_reports = False
        RENDERS.clear()


API = _ApiState()


@guarded("vllm.render")
def _note_render(renderer: Any, start_ns: int, end_ns: int, result: Any) -> None:
    for token_ids in X.rendered_token_lists(result):
        RENDERS.add(token_ids, start_ns, end_ns)
    if API.model is None:
        API.model = X.model_name(getattr(renderer, "config", None))


def _render_wrapper(is_async: bool) -> _Wrapper:
    if is_async:
        def wrapper_async(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            async def run() -> Any:
                start = monotonic_ns()
                with _tokenizer_scope():
                    result = await wrapped(*args, **kwargs)
                _note_render(instance, start, monotonic_ns(), result)
                return result

            return run()

        return wrapper_async

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        start = monotonic_ns()
        with _tokenizer_scope():
            result = wrapped(*args, **kwargs)
        _note_render(instance, start, monotonic_ns(), result)
        return result

    return wrapper


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


@guarded("vllm.api.add_request")
def _open_api_request(request: Any) -> RequestHandle | None:
    params = X.request_params(request)
    if not params.request_id or params.request_id in API.open:
        return None  # a streaming-input continuation of a request already open
    now = monotonic_ns()
    render = RENDERS.pop(getattr(request, "prompt_token_ids", None))
    carrier = None
    if not trace.get_current_span().get_span_context().is_valid:
        # No SERVER span here: join the caller's trace that vLLM passed along (--otlp-traces-endpoint).
        carrier = X.carrier_from(getattr(request, "trace_headers", None))
    handle = start_request(params.request_id, model=API.model, prompt_tokens=params.prompt_tokens,
                           max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
                           stream=params.stream, carrier=carrier, attributes={semconv.GEN_AI_SYSTEM: "vllm"},
                           arrival_ns=_arrival_ns(request, now, render))
    if render is not None:
        handle.tokenized(params.prompt_tokens or 0, render[0], render[1])
    request.trace_headers = X.merge_carrier(getattr(request, "trace_headers", None), handle.carrier())
    if len(API.open) >= C.MAX_OPEN_REQUESTS:
        oldest = next(iter(API.open))
        API.open.pop(oldest).aborted(reason=semconv.FINISH_ABORT)
    API.open[params.request_id] = handle
    return handle


def _api_add_request(positions: dict[str, int]) -> _Wrapper:
    get_request = _binder(positions, "request")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        handle = _open_api_request(get_request(args, kwargs))
        try:
            return wrapped(*args, **kwargs)
        except BaseException as exc:
            if handle is not None:
                _close_api(handle, exc)
            raise

    return wrapper


@guarded("vllm.api.close")
def _close_api(handle: RequestHandle, error: BaseException) -> None:
    API.open.pop(handle.request_id, None)
    handle.aborted(error if isinstance(error, Exception) else None)


@guarded("vllm.api.tokens")
def _api_tokens(outputs: Any, now: int) -> list[X.OutputEvent]:
    events = X.output_events(outputs or ())
    for event in events:
        handle = API.open.get(event.request_id)
        if handle is not None and event.new_tokens:
            handle.token(event.new_tokens, now)
    return events


@guarded("vllm.api.outputs")
def _api_after(processor: Any, outputs: Any, events: list[X.OutputEvent] | None, duration_ns: int) -> None:
    if not events:
        return
    share = duration_ns // len(events)
    states = getattr(processor, "request_states", None)
    headers_by_id = {str(getattr(o, "request_id", "")): getattr(o, "trace_headers", None) for o in outputs}
    for event in events:
        handle = API.open.get(event.request_id)
        if handle is None:
            continue
        handle.detokenized(share)
        summary = X.decode_summary(headers_by_id.get(event.request_id))
        if summary is not None:  # at the first token (queue, prefill) and at the end (all)
            API.engine_reports = True
            handle.engine_summary(summary)
        still_open = event.request_id in states if isinstance(states, dict) else event.finish_reason is None
        if still_open:
            continue
        API.open.pop(event.request_id, None)
        if handle.summary_in is None and API.engine_reports:
            handle.engine_summary({})  # the engine traces this request's phases; never approximate them here
        # No finish reason from the engine but the request is done: vLLM's detokenizer matched a stop string.
        reason = event.finish_reason or semconv.FINISH_STOP
        if reason in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
            handle.aborted(reason=reason)
        else:
            handle.finished(reason)


def _api_process_outputs(positions: dict[str, int]) -> _Wrapper:
    get_outputs = _binder(positions, "engine_core_outputs")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        outputs = get_outputs(args, kwargs)
        start = monotonic_ns()
        events = _api_tokens(outputs, start)
        with _tokenizer_scope():
            result = wrapped(*args, **kwargs)
        _api_after(instance, outputs or (), events, monotonic_ns() - start)
        return result

    return wrapper


@guarded("vllm.api.abort")
def _api_aborted(request_ids: Any) -> None:
    for request_id in request_ids or ():
        handle = API.open.pop(str(request_id), None)
        if handle is not None:
            handle.aborted(reason=semconv.FINISH_ABORT)


def _api_abort_requests(positions: dict[str, int]) -> _Wrapper:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        _api_aborted(result)  # the internal ids vLLM actually aborted
        return result

    return wrapper


@guarded("vllm.api.error")
def _api_errored(error: Any) -> None:
    handles = list(API.open.values())
    API.open.clear()
    for handle in handles:
        handle.aborted(error if isinstance(error, Exception) else None)


def _api_propagate_error(positions: dict[str, int]) -> _Wrapper:
    get_error = _binder(positions, "e")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _api_errored(get_error(args, kwargs))
        return wrapped(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------- EngineCore side
class _EngineState:
    """One Scheduler's timeline and the engine half of its requests."""

    def __init__(self, scheduler: Any) -> None:
        config = getattr(scheduler, "vllm_config", None)
        self.model = X.model_name(config)
        self.tracker = RequestTracker()
        self.tracer = EngineTracer(X.engine_id(config), self.tracker)
        self.handles: dict[str, RequestHandle] = {}


class _Pending:
    """A step between ``schedule()`` and ``update_from_output()`` (several overlap with async scheduling)."""

    __slots__ = ("forward_start_ns", "output", "schedule_end_ns", "state", "step")

    def __init__(self, output: Any, step: StepRecord, state: _EngineState, schedule_end_ns: int) -> None:
        self.output = output  # held so that id(output) stays unique while pending
        self.step = step
        self.state = state
        self.schedule_end_ns = schedule_end_ns
        self.forward_start_ns: int | None = None


_ENGINES: weakref.WeakKeyDictionary[Any, _EngineState] = weakref.WeakKeyDictionary()
_PENDING: dict[int, _Pending] = {}


def _state(scheduler: Any) -> _EngineState:
    state = _ENGINES.get(scheduler)
    if state is None:
        state = _ENGINES[scheduler] = _EngineState(scheduler)
    return state


def engine_states() -> list[Any]:
    """The engine states of this process (for tests and ``flush``)."""
    return list(_ENGINES.values())


@guarded("vllm.engine.add_request")
def _engine_add(scheduler: Any, request: Any) -> None:
    state = _state(scheduler)
    params = X.request_params(request)
    if not params.request_id or params.request_id in state.handles:
        return
    carrier = X.carrier_from(getattr(request, "trace_headers", None))
    state.handles[params.request_id] = state.tracker.add(
        params.request_id, carrier=carrier, arrival_ns=monotonic_ns(), model=state.model,
        prompt_tokens=params.prompt_tokens, max_tokens=params.max_tokens, temperature=params.temperature,
        top_p=params.top_p, attributes={semconv.GEN_AI_SYSTEM: "vllm"})


def _engine_add_request(positions: dict[str, int]) -> _Wrapper:
    get_request = _binder(positions, "request")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        _engine_add(instance, get_request(args, kwargs))
        return result

    return wrapper


@guarded("vllm.engine.begin")
def _begin(scheduler: Any) -> StepRecord | None:
    return _state(scheduler).tracer.begin_step()


@guarded("vllm.engine.scheduled")
def _engine_scheduled(scheduler: Any, step: StepRecord, output: Any, end_ns: int) -> None:
    state = _state(scheduler)
    step.add_phase("schedule", step.start_ns, end_ns)
    info = X.batch_info(output, getattr(scheduler, "requests", None) or {})
    for request_id in info.preempted_ids:
        handle = state.handles.get(request_id)
        if handle is not None:
            handle.preempted(end_ns)
    waiting, running = X.queue_counts(scheduler.get_request_counts())
    step.batch([rid for rid in info.request_ids if rid in state.handles], prefill_tokens=info.prefill_tokens,
               decode_tokens=info.decode_tokens, waiting=waiting, running=running,
               kv_cache_usage=X.kv_cache_usage(scheduler.get_kv_cache_usage()),
               preempted=len(info.preempted_ids))
    if len(_PENDING) >= C.MAX_PENDING_STEPS:
        _PENDING.pop(next(iter(_PENDING)))
    _PENDING[id(output)] = _Pending(output, step, state, end_ns)


def _engine_schedule(positions: dict[str, int]) -> _Wrapper:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        step = _begin(instance)
        output = wrapped(*args, **kwargs)
        if step is not None:
            _engine_scheduled(instance, step, output, monotonic_ns())
        return output

    return wrapper


def _take_pending(output: Any) -> _Pending | None:
    pending = _PENDING.pop(id(output), None)
    return pending if pending is not None and pending.output is output else None


def _executor_execute_model(positions: dict[str, int]) -> _Wrapper:
    get_output = _binder(positions, "scheduler_output")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pending = _PENDING.get(id(get_output(args, kwargs)))
        if pending is not None and pending.forward_start_ns is None:
            pending.forward_start_ns = monotonic_ns()
        return wrapped(*args, **kwargs)

    return wrapper


@guarded("vllm.engine.updated")
def _engine_updated(scheduler: Any, pending: _Pending | None, result: Any,
                    start_ns: int, end_ns: int) -> None:
    state = _state(scheduler)
    step = pending.step if pending is not None else None
    if pending is not None and step is not None:
        # Dispatch -> outputs back in EngineCore: the forward pass and sampling, as the engine sees them.
        step.add_phase("forward", pending.forward_start_ns or pending.schedule_end_ns, start_ns)
        step.add_phase("postprocess", start_ns, end_ns)
    for output in X.engine_outputs(result):
        request_id = str(getattr(output, "request_id", ""))
        handle = state.handles.get(request_id)
        if handle is None:
            continue
        tokens = len(getattr(output, "new_token_ids", None) or ())
        first = tokens > 0 and not handle.token_ns
        if tokens:
            handle.token(tokens, start_ns)
        reason = X.finish_reason(getattr(output, "finish_reason", None))
        if reason is None:
            if first:
                # Queue and prefill are known at the first token: send them now, so that a request
                # the API server ends itself (a stop string) still gets them.
                output.trace_headers = X.with_summary(getattr(output, "trace_headers", None),
                                                      X.first_token_summary(handle.summary()))
            continue
        del state.handles[request_id]
        if reason in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
            summary = state.tracker.aborted(request_id, reason=reason)
        else:
            summary = state.tracker.finished(request_id, reason)
        output.trace_headers = X.with_summary(getattr(output, "trace_headers", None), summary)
    if step is not None:
        state.tracer.end_step(step)
    if not scheduler.has_requests():
        # The engine goes idle: close the window now, or its steps would wait for the next request.
        state.tracer.flush_window()


def _engine_update_from_output(positions: dict[str, int]) -> _Wrapper:
    get_output = _binder(positions, "scheduler_output")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        start = monotonic_ns()
        pending = _take_pending(get_output(args, kwargs))
        result = wrapped(*args, **kwargs)
        _engine_updated(instance, pending, result, start, monotonic_ns())
        return result

    return wrapper


@guarded("vllm.engine.finished")
def _engine_finished(scheduler: Any, requests: Any, status: Any) -> None:
    state = _state(scheduler)
    reason = semconv.FINISH_ERROR if "ERROR" in str(status).upper() else semconv.FINISH_ABORT
    for request in requests or ():
        request_id = str(getattr(request, "request_id", ""))
        if state.handles.pop(request_id, None) is not None:
            state.tracker.aborted(request_id, reason=reason)


def _engine_finish_requests(positions: dict[str, int]) -> _Wrapper:
    get_status = _binder(positions, "finished_status")

    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        _engine_finished(instance, result, get_status(args, kwargs))
        return result

    return wrapper


# --------------------------------------------------------------------------- the instrumentor
def _wrapper_for(checked: Checked) -> _Wrapper | None:
    path, positions = checked.target.path, checked.positions
    if path.startswith("BaseRenderer."):
        return _render_wrapper(path.endswith("_async"))
    factories: dict[str, Callable[[dict[str, int]], _Wrapper]] = {
        "OutputProcessor.add_request": _api_add_request,
        "OutputProcessor.process_outputs": _api_process_outputs,
        "OutputProcessor.abort_requests": _api_abort_requests,
        "OutputProcessor.propagate_error": _api_propagate_error,
        "Scheduler.add_request": _engine_add_request,
        "Scheduler.schedule": _engine_schedule,
        "Scheduler.update_from_output": _engine_update_from_output,
        "Scheduler.finish_requests": _engine_finish_requests,
    }
    factory = factories.get(path)
    if factory is None and path.endswith(".execute_model"):
        factory = _executor_execute_model
    return factory(positions) if factory is not None else None


class VllmInstrumentor(Instrumentor):
    """vLLM (v1 engine): request traces in the API server, engine windows in EngineCore."""

    name = "vllm"
    trigger = C.TRIGGER
    distribution = C.DISTRIBUTION
    supported = C.SUPPORTED

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def instrument(self, **options: Any) -> None:
        """Check the installed vLLM first: an unsupported version or any changed target -> off."""
        if self.active:
            return
        try:
            self.problems = self.preflight()
        except Exception as exc:  # noqa: BLE001 - a broken check must not break vLLM's import
            self.problems = [f"target check failed: {type(exc).__name__}: {exc}"]
        if self.problems:
            warn_once("vllm:off", "llmtrace: vLLM adapter is OFF for vllm %s (supported %s): %s",
                      self.installed_version(), C.SUPPORTED, "; ".join(self.problems))
            return
        super().instrument(**options)

    def preflight(self) -> list[str]:
        version = self.installed_version()
        if not X.version_supported(version, C.SUPPORTED_MIN, C.SUPPORTED_MAX_EXCLUSIVE):
            return [f"version {version} is outside the supported range {C.SUPPORTED}"]
        return check_targets()[1]

    def _patch(self) -> None:
        checked, problems = check_targets()
        if problems:  # changed between preflight and now (a concurrent import): stay off
            raise RuntimeError("; ".join(problems))
        for item in checked:
            if item.target.path in C.CHECK_ONLY:
                continue
            wrapper = _wrapper_for(item)
            if wrapper is None or not self.patches.wrap(item.target.module, item.target.path, wrapper):
                raise RuntimeError(f"could not wrap {item.target.module}.{item.target.path}")

    def _unpatch(self) -> None:
        for state in list(_ENGINES.values()):
            state.tracer.flush_window()
        _PENDING.clear()
        API.reset()
