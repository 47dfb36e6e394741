"""Wiring of the ``torch`` integration: forward hooks on chosen models, never a global patch.

Hooks are registered per model instance (``register_forward_pre_hook`` /
``register_forward_hook(always_call=True)``) and their handles kept so that
:func:`uninstrument_model` (and ``llmtrace.uninstrument()``) removes them. A
forward that runs inside another traced forward (GPT2LMHeadModel -> GPT2Model,
both hooked) is not timed again.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
import weakref
from typing import Any

from llmtrace import semconv
from llmtrace._safety import guarded, record_error
from llmtrace.integrations import _common
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.torch import _constants, extractors
from llmtrace.lifecycle.clock import monotonic_ns
from llmtrace.lifecycle.request import current_request


class StepSink:
    """Collects forward start times of one ``generate()`` call instead of spans.

    ``generate()`` runs one top-level forward per decoding step; the start of
    forward *k+1* is when token *k* exists on the host (the library has already
    synchronised to check its stopping criteria), so these readings time the
    tokens without any extra device synchronisation.
    """

    __slots__ = ("forward_ns", "model")

    def __init__(self, model: Any) -> None:
        self.model = model
        self.forward_ns: list[int] = []


_sink: contextvars.ContextVar[StepSink | None] = contextvars.ContextVar("llmtrace_step_sink", default=None)


def set_sink(sink: StepSink | None) -> contextvars.Token[StepSink | None]:
    return _sink.set(sink)


def reset_sink(token: contextvars.Token[StepSink | None]) -> None:
    _sink.reset(token)


class _Frame:
    __slots__ = ("hooks", "in_generate", "layers", "module", "start_ns", "token")

    def __init__(self, hooks: _HookSet, module: Any, start_ns: int) -> None:
        self.hooks = hooks
        self.module = module
        self.start_ns = start_ns
        self.token: contextvars.Token[_Frame | None] | None = None
        self.layers: list[tuple[str, int, int]] | None = None
        self.in_generate = False


_frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar("llmtrace_forward", default=None)


class _HookSet:
    """The hooks llmtrace put on one model, and how that model is traced."""

    __slots__ = ("always", "engine_id", "handles", "layers")

    def __init__(self, always: bool, engine_id: str | None, layers: bool) -> None:
        self.always = always  # instrument_model(): span even with no current span
        self.engine_id = engine_id
        self.layers = layers
        self.handles: list[Any] = []


_lock = threading.Lock()
_hooked: weakref.WeakKeyDictionary[Any, _HookSet] = weakref.WeakKeyDictionary()


def _pre_hook(hooks: _HookSet, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if _frame.get() is not None:
        return
    sink = _sink.get()
    in_generate = sink is not None and sink.model is module
    # Decided when the forward starts, in the context it runs in: a forward nothing would record
    # (an engine loop's, where the step's phases time it, or an unsampled request's) gets no
    # frame, so the post-hook returns at its first line. Deciding at the end instead cost every
    # such forward a frame, a context-variable set and reset and two lookups of its hooks.
    if not in_generate and not hooks.always and not _observed():
        return
    now = monotonic_ns()
    frame = _Frame(hooks, module, now)
    if in_generate:
        sink.forward_ns.append(now)  # type: ignore[union-attr]  # in_generate: sink is not None
        frame.in_generate = True
    elif hooks.layers:
        frame.layers = []
    frame.token = _frame.set(frame)


def _observed() -> bool:
    """Whether a forward starting now would be recorded: it runs in a request, or under a
    recording span. Never raises into the model's forward: when in doubt, it is recorded."""
    try:
        return current_request() is not None or _common._current_span_recording()
    except Exception as exc:  # noqa: BLE001 - counted; the forward is then timed as before
        record_error("torch.forward_observed", exc)
        return True


def _post_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
    frame = _frame.get()
    if frame is None or frame.module is not module:
        return
    end = monotonic_ns()
    if frame.token is not None:
        _frame.reset(frame.token)
    if frame.in_generate:
        return
    error = sys.exc_info()[1]
    _emit_forward(module, args, kwargs, frame, end, error)


@guarded("torch.forward")
def _emit_forward(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], frame: _Frame, end_ns: int,
                  error: BaseException | None) -> None:
    hooks = frame.hooks
    handle = current_request()
    parent = handle.context() if handle is not None else None
    attrs = extractors.forward_attributes(type(module).__name__, extractors.forward_inputs(args, kwargs),
                                          hooks.engine_id)
    import torch

    attrs.update(extractors.memory_attributes(torch))
    if frame.layers:
        _forward_with_layers(parent, frame, end_ns, attrs, error)
        return
    _common.live_span(semconv.SPAN_FORWARD, parent, frame.start_ns, end_ns, attrs,
                      error if isinstance(error, Exception) else None)


def _forward_with_layers(parent: Any, frame: _Frame, end_ns: int, attrs: dict[str, Any],
                         error: BaseException | None) -> None:
    from opentelemetry import trace

    from llmtrace import _runtime
    from llmtrace.lifecycle.clock import to_wall_ns

    tracer = _runtime.tracer()
    offset = _common.span_tree_offset(end_ns)  # the request's, for the forward and its layers
    span = tracer.start_span(semconv.SPAN_FORWARD, context=parent, start_time=to_wall_ns(frame.start_ns, offset),
                             attributes=attrs)
    ctx = trace.set_span_in_context(span)
    for name, start, end in frame.layers or ():
        _common.live_span(semconv.SPAN_LAYER, ctx, start, end, {semconv.LLM_LAYER_NAME: name}, offset=offset)
    if isinstance(error, Exception):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.record_exception(error)
    span.end(end_time=to_wall_ns(end_ns, offset))


def _layer_hooks(name: str) -> tuple[Any, Any]:
    def pre(module: Any, args: tuple[Any, ...]) -> None:
        frame = _frame.get()
        if frame is not None and frame.layers is not None:
            frame.layers.append((name, monotonic_ns(), 0))

    def post(module: Any, args: tuple[Any, ...], output: Any) -> None:
        frame = _frame.get()
        if frame is not None and frame.layers:
            layer, start, _ = frame.layers[-1]
            frame.layers[-1] = (layer, start, monotonic_ns())

    return pre, post


def hook_model(model: Any, *, always: bool, layers: bool = False, engine_id: str | None = None) -> bool:
    """Put llmtrace's forward hooks on *model* (once); False if it already has them."""
    with _lock:
        if model in _hooked:
            return False
        hooks = _HookSet(always, engine_id, layers)
        # The hooks are bound to their model's _HookSet: no lookup per forward.
        hooks.handles.append(model.register_forward_pre_hook(functools.partial(_pre_hook, hooks), with_kwargs=True))
        hooks.handles.append(model.register_forward_hook(_post_hook, with_kwargs=True, always_call=True))
        if layers:
            for name, layer in extractors.layer_modules(model):
                pre, post = _layer_hooks(name)
                hooks.handles.append(layer.register_forward_pre_hook(pre))
                hooks.handles.append(layer.register_forward_hook(post, always_call=True))
        _hooked[model] = hooks
        return True


def is_hooked(model: Any) -> bool:
    return model in _hooked


def unhook_model(model: Any) -> None:
    with _lock:
        hooks = _hooked.pop(model, None)
    if hooks is not None:
        for handle in hooks.handles:
            handle.remove()


def unhook_all() -> None:
    with _lock:
        models = list(_hooked.keys())
    for model in models:
        unhook_model(model)


def instrument_model(model: Any, *, layers: bool = False, engine_id: str | None = None) -> Any:
    """Trace *model*'s forward as ``llm.forward`` (and its layers as ``llm.layer`` when asked)."""
    try:
        if is_hooked(model):
            unhook_model(model)  # re-hook with the options given now
        hook_model(model, always=True, layers=layers, engine_id=engine_id)
    except Exception as exc:  # noqa: BLE001 - tracing a model must never break loading it
        from llmtrace._safety import record_error

        record_error("torch.instrument_model", exc)
    return model


def uninstrument_model(model: Any) -> Any:
    """Remove llmtrace's hooks from *model*."""
    unhook_model(model)
    return model


class TorchInstrumentor(Instrumentor):
    """Nothing global to patch: hooks live on model instances; uninstrument removes them all."""

    name = "torch"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def _patch(self) -> None:
        return None

    def _unpatch(self) -> None:
        unhook_all()
