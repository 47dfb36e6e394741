"""Wiring of ``GenerationMixin.generate`` -> one ``llm.request`` (or the current one).

Timeline of one call, and where each reading comes from::

    arrival        the server call's arrival (ServerScope) or the generate() call
    scheduled      generate() entered (prefill starts)
    token k        start of forward k+1 (token k is on the host: the library already
                   synchronised to check its stopping criteria); the last token: return
    finished       return — or, inside a server call, when the response is complete

Per-step work is one ``monotonic_ns()`` append in the model's forward pre-hook.
Per-sequence numbers (real prompt lengths, tokens up to eos, finish reasons) are
read once from the returned tensor, after ``generate()`` returned.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from contextlib import AbstractContextManager
from typing import Any

import wrapt
from opentelemetry import trace

from llmtrace import _runtime, semconv
from llmtrace._safety import guarded
from llmtrace.integrations import _common
from llmtrace.integrations.torch import patch as torch_patch
from llmtrace.integrations.transformers import _constants, extractors
from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.lifecycle.request import RequestHandle, current_request, start_request
from llmtrace.lifecycle.scope import DeferredFinish, ServerScope, current_scope

_in_generate: contextvars.ContextVar[bool] = contextvars.ContextVar("llmtrace_in_generate", default=False)


class _State:
    """One traced ``generate()`` call."""

    __slots__ = ("activation", "attention_mask", "generation_config", "handle", "input_ids", "model", "owned",
                 "params", "scope", "sink", "sink_token", "streamer", "timed_streamer")

    def __init__(self, model: Any) -> None:
        self.model = model
        self.handle: RequestHandle | None = None
        self.owned = False
        self.scope: ServerScope | None = None
        self.sink = torch_patch.StepSink(model)
        self.sink_token: Any = None
        self.activation: AbstractContextManager[Any] | None = None
        self.input_ids: Any = None
        self.attention_mask: Any = None
        self.generation_config: Any = None
        self.streamer: Any = None
        self.timed_streamer: _TimedStreamer | None = None
        self.params: extractors.GenerateParams | None = None


def generate_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _in_generate.get():  # an assistant model's generate() inside ours
        return wrapped(*args, **kwargs)
    carried = _carried_context(wrapped, args, kwargs)
    if carried is not None:
        return carried.run(_traced_generate, wrapped, instance, args, kwargs)
    return _traced_generate(wrapped, instance, args, kwargs)


@guarded("transformers.generate.context")
def _carried_context(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> contextvars.Context | None:
    """The handler's context carried by a streamer, when generate() runs in a bare thread."""
    if current_request() is not None or current_scope() is not None or trace.get_current_span().is_recording():
        return None
    streamer = kwargs.get("streamer")  # passed by keyword in practice (it is generate()'s 8th parameter)
    carried = getattr(streamer, _constants.STREAMER_CONTEXT_ATTR, None)
    return carried.copy() if isinstance(carried, contextvars.Context) else None


def _traced_generate(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    token = _in_generate.set(True)
    try:
        state = _begin(wrapped, instance, args, kwargs)
        if state is None:
            return wrapped(*args, **kwargs)
        if state.timed_streamer is not None:
            args, kwargs = _with_streamer(wrapped, args, kwargs, state.timed_streamer)
        try:
            output = wrapped(*args, **kwargs)
        except BaseException as exc:
            _exit(state)
            _fail(state, exc)
            raise
        _exit(state)
        _finish(state, output)
        return output
    finally:
        _in_generate.reset(token)


@functools.lru_cache(maxsize=64)
def _signature(function: Any) -> inspect.Signature:
    return inspect.signature(function)


def _bind(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    # Bound methods are new objects per call: cache on the function underneath.
    bound = _signature(getattr(wrapped, "__func__", wrapped)).bind_partial(*_self_args(wrapped), *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self", None)
    extra = arguments.pop("kwargs", None) or {}
    arguments.update(extra)
    return arguments


def _self_args(wrapped: Any) -> tuple[Any, ...]:
    owner = getattr(wrapped, "__self__", None)
    return (owner,) if owner is not None and hasattr(wrapped, "__func__") else ()


@guarded("transformers.generate.begin")
def _begin(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _State | None:
    arguments = _bind(wrapped, args, kwargs)
    state = _State(instance)
    state.input_ids = arguments.get("inputs")
    if state.input_ids is None:
        state.input_ids = arguments.get("input_ids")
    state.attention_mask = arguments.get("attention_mask")
    state.generation_config = arguments.get("generation_config")
    state.streamer = arguments.get("streamer")
    if state.streamer is not None:
        state.timed_streamer = _TimedStreamer(state.streamer)
    state.params = extractors.generate_params(instance, state.generation_config, arguments, state.streamer)
    now = monotonic_ns()
    handle = current_request()
    if handle is None:
        state.scope = scope = current_scope()
        arrival = scope.arrival_ns if scope is not None and not scope.closed else now
        params = state.params
        handle = start_request(model=params.model, max_tokens=params.max_new_tokens,
                               temperature=params.temperature, top_p=params.top_p, stream=params.stream,
                               operation=_constants.OPERATION, arrival_ns=arrival)
        state.owned = True
        if scope is not None:
            scope.adopt_pending(handle)
    handle.scheduled(at_ns=now)
    state.handle = handle
    if not torch_patch.is_hooked(instance):
        torch_patch.hook_model(instance, always=False)
    # Context changes last, so that a failure above leaves nothing attached.
    state.sink_token = torch_patch.set_sink(state.sink)
    state.activation = handle.activate()
    state.activation.__enter__()
    return state


def _exit(state: _State) -> None:
    if state.activation is not None:
        state.activation.__exit__(None, None, None)
    if state.sink_token is not None:
        torch_patch.reset_sink(state.sink_token)


class _TimedStreamer(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """The user's streamer, noting when each token is handed to it: for a streamed
    response that is when the token exists for the client (the library has already
    moved it to the host)."""

    def __init__(self, streamer: Any) -> None:
        super().__init__(streamer)
        self._self_put_ns: list[int] = []

    def put(self, value: Any) -> Any:
        self._self_put_ns.append(monotonic_ns())
        return self.__wrapped__.put(value)


def _with_streamer(wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   streamer: _TimedStreamer) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if "streamer" in kwargs:
        return args, {**kwargs, "streamer": streamer}
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.arguments["streamer"] = streamer
    return bound.args, bound.kwargs


def _token_times(state: _State, generated_steps: int, end_ns: int) -> list[int]:
    puts = state.timed_streamer._self_put_ns[1:] if state.timed_streamer is not None else []
    if len(puts) >= generated_steps > 0:  # the first put() is the prompt
        return puts[:generated_steps]
    starts = state.sink.forward_ns
    times = [*starts[1:], end_ns] if starts else [end_ns]
    return times[: max(0, generated_steps)]


@guarded("transformers.generate.fail")
def _fail(state: _State, error: BaseException) -> None:
    handle = state.handle
    if handle is None:
        return
    for at in state.sink.forward_ns[1:]:
        handle.token(1, at_ns=at)
    if state.owned:
        handle.aborted(error if isinstance(error, Exception) else None)


@guarded("transformers.generate.finish")
def _finish(state: _State, output: Any) -> None:
    end = monotonic_ns()
    handle, params = state.handle, state.params
    if handle is None or params is None:
        return
    sequences = extractors.output_sequences(output)
    start = _generated_offset(state, sequences)
    generated = sequences[:, start:].tolist() if hasattr(sequences, "shape") and len(sequences.shape) == 2 else []
    steps = len(generated[0]) if generated else 0
    for at in _token_times(state, steps, end):
        handle.token(1, at_ns=at)
    if not state.owned:
        return
    outcomes = extractors.sequence_outcomes(generated, extractors.eos_ids(state.model, state.generation_config),
                                            params.max_new_tokens)
    prompts = extractors.prompt_lengths(state.input_ids, state.attention_mask)
    if prompts:
        handle.prompt_tokens = sum(prompts)
    reasons = [o.finish_reason for o in outcomes] or [semconv.FINISH_STOP]
    handle.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    if len(outcomes) > 1:
        handle.attributes[semconv.LLM_BATCH_SIZE] = len(outcomes)
        if handle.span is not None and handle.span.is_recording():
            handle.span.set_attributes({semconv.LLM_BATCH_SIZE: len(outcomes),
                                        semconv.LLM_BATCH_INPUT_TOKENS: prompts,
                                        semconv.LLM_BATCH_OUTPUT_TOKENS: [o.output_tokens for o in outcomes]})
    reason = semconv.FINISH_LENGTH if semconv.FINISH_LENGTH in reasons else semconv.FINISH_STOP
    total = sum(o.output_tokens for o in outcomes)
    completion = _completion(state, generated, outcomes)
    scope = state.scope
    if scope is not None and scope.defer_finish(handle, DeferredFinish(reason, total, completion)):
        return
    if scope is not None and scope.closed_ns is not None:
        # The response completed while this thread was still returning: the request
        # ended with it (a child never outlives the SERVER span).
        end = max(min(end, scope.closed_ns), handle.token_ns[-1] if handle.token_ns else 0)
    handle.finished(reason, output_tokens=total, completion=completion, at_ns=end)


def _generated_offset(state: _State, sequences: Any) -> int:
    config = getattr(state.model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return 1  # the decoder start token
    ids = state.input_ids
    return int(ids.shape[-1]) if ids is not None and hasattr(ids, "shape") else 0


def _completion(state: _State, generated: list[list[int]], outcomes: list[extractors.SequenceOutcome]) -> str | None:
    """The first sequence's text, only with capture_content and a tokenizer at hand (the streamer's)."""
    if not _runtime.settings().capture_content or not generated:
        return None
    tokenizer = getattr(state.streamer, "tokenizer", None)
    if tokenizer is None:
        return None
    with _common.tokenizer_call():  # our own decode is not the user's detokenize
        text = tokenizer.decode(generated[0][: outcomes[0].output_tokens], skip_special_tokens=True)
    return _common.capture_text(text)


def streamer_init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    _remember_context(instance)
    return result


@guarded("transformers.streamer")
def _remember_context(streamer: Any) -> None:
    """A streamer is made in the handler and handed to a thread running generate():
    it carries the handler's context there (see :func:`_carried_context`)."""
    if current_request() is not None or current_scope() is not None or trace.get_current_span().is_recording():
        setattr(streamer, _constants.STREAMER_CONTEXT_ATTR, contextvars.copy_context())
