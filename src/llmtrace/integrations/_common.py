"""What the request-pipeline integrations share: nesting suppression, and where a
tokenizer or forward measurement goes.

Where an encode goes (one user call is exactly one record, never two):

1. a request is current (``current_request()``) -> ``handle.tokenized(...)``; the
   span builder makes the ``llm.tokenize`` child of ``llm.request``;
2. else a server scope is current (a network handler, no request yet) -> parked on
   the scope, adopted by the request ``generate()`` opens next, or emitted under the
   SERVER span when the call ends;
3. else a recording span is current -> a ``llm.tokenize`` child of it;
4. else nothing: a tokenizer used outside any traced work (at start-up, in a data
   pipeline) does not produce root spans.

Decodes follow the same order, except that during a request they only add to
``llm.detokenize.total_s`` (incremental detokenization), and a final decode after
``generate()`` returned inside a server call becomes an ``llm.detokenize`` child of
that request.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry.trace import Status, StatusCode

from llmtrace import _native, _runtime, semconv
from llmtrace._safety import guarded, record_error
from llmtrace.lifecycle.clock import monotonic_ns, recent_offset_ns, to_wall_ns
from llmtrace.lifecycle.current import SPAN_KEY, current_context
from llmtrace.lifecycle.request import REQUEST_VAR, get_request
from llmtrace.lifecycle.scope import SCOPE_VAR, PendingTokenize, ServerScope, get_scope

#: Set while a traced tokenizer call runs: the library's own nested calls
#: (transformers -> tokenizers, encode -> __call__ -> encode_batch) pass straight through.
#: A decode of at most this many tokens outside any request is incremental streaming
#: detokenization: no span for it (that would be a span per token).
INCREMENTAL_DECODE_MAX_TOKENS = 2

_in_tokenizer: contextvars.ContextVar[bool] = contextvars.ContextVar("llmtrace_in_tokenizer", default=False)
#: The flag :func:`tokenizer_call` sets, for a wrapper on a per-step path to set and reset itself
#: (``IN_TOKENIZER.set(True)`` ... ``IN_TOKENIZER.reset(token)`` in a ``finally``): a generator
#: context manager costs several times the two calls.
IN_TOKENIZER = _in_tokenizer


def tokenizer_busy() -> bool:
    """Whether a tokenizer call now would pass straight through: nested in a call llmtrace times
    (the context variable), or in one a compiled method passed through (a flag of the thread's)."""
    if _in_tokenizer.get():
        return True
    native = _native.load()
    return native is not None and bool(native.tokenizer_passing_through())


@contextmanager
def tokenizer_call() -> Iterator[None]:
    token = _in_tokenizer.set(True)
    try:
        yield
    finally:
        _in_tokenizer.reset(token)


def capture_text(text: Any) -> str | None:
    """*text* (or the first of a batch) when content capture is on, else None."""
    settings = _runtime.settings()
    if not settings.capture_content:
        return None
    if isinstance(text, (list, tuple)):
        text = text[0] if text else None
    if not isinstance(text, str):
        return None
    return text[: settings.capture_content_max_chars]


def span_tree_offset(end_ns: int) -> int:
    """The wall-minus-monotonic offset for a span made now, ending at *end_ns*: the current
    request's or server call's (one span tree, one offset: lifecycle/clock.py), else a recent one."""
    if (handle := get_request()) is not None:
        return handle.wall_offset_ns
    if (scope := get_scope()) is not None:
        return scope.wall_offset_ns
    return recent_offset_ns(end_ns)


def live_span(name: str, parent: otel_context.Context | None, start_ns: int, end_ns: int,
              attributes: dict[str, Any], error: BaseException | None = None, offset: int | None = None) -> None:
    """A finished span with explicit monotonic start/end, as a child of *parent*, converted with
    *offset* (its parent's) or :func:`span_tree_offset` — one offset for both ends."""
    end_ns = max(start_ns, end_ns)
    offset = span_tree_offset(end_ns) if offset is None else offset
    span = _runtime.tracer().start_span(name, context=parent, start_time=to_wall_ns(start_ns, offset))
    if span.is_recording():
        span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.record_exception(error)
    span.end(end_time=to_wall_ns(end_ns, offset))


def _current_span_recording() -> bool:
    """``trace.get_current_span().is_recording()``, without the API's four frames: asked per
    streamed decode and per forward."""
    span = current_context().get(SPAN_KEY)
    return span is not None and span.is_recording()


def record_tokenize(start_ns: int, end_ns: int, tokens: int, batch: int, tokenizer_class: str,
                    text: str | None = None, error: BaseException | None = None) -> None:
    """Report one user-level encode (see the module docstring for where it goes). Unguarded: its
    caller, the encode hook, is guarded (``tokenize.wrapper``) — one frame less per encode."""
    handle = get_request()
    if handle is not None and error is None:
        handle.tokenized(tokens, start_ns, end_ns)
        if text is not None and handle.prompt is None:
            handle.prompt = text
        return
    scope = get_scope()
    if scope is not None and not scope.closed and error is None:
        scope.park(PendingTokenize(start_ns, end_ns, tokens, batch, tokenizer_class, text))
        return
    if _current_span_recording() or (handle is not None and error is not None):
        parent = handle.context() if handle is not None else None
        live_span(semconv.SPAN_TOKENIZE, parent, start_ns, end_ns, _tokenize_attrs(tokens, batch, tokenizer_class),
                  error)


def _tokenize_attrs(tokens: int, batch: int, tokenizer_class: str) -> dict[str, Any]:
    return {semconv.LLM_TOKENIZE_TOKENS: tokens, semconv.LLM_TOKENIZE_BATCH: batch,
            semconv.LLM_TOKENIZER_CLASS: tokenizer_class}


class DecodeCall(NamedTuple):
    """One user-level decode; what it produced is worked out only where a span needs it
    (most decodes are one token of a streamed response: a duration added to the request)."""

    count: Any  # (args, kwargs) -> tokens
    instance: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any
    error: BaseException | None

    def attributes(self) -> dict[str, Any]:
        return {semconv.LLM_DETOKENIZE_TOKENS: self.tokens(), semconv.LLM_TOKENIZER_CLASS: type(self.instance).__name__}

    def tokens(self) -> int:
        return int(self.count(self.args, self.kwargs)) if self.error is None else 0


@guarded("detokenize.wrapper")
def record_detokenize(start_ns: int, end_ns: int, call: DecodeCall) -> None:
    """Report one user-level decode."""
    duration, error = end_ns - start_ns, call.error
    handle = get_request()
    if handle is not None:
        handle.detokenized(duration)
        if error is not None:
            live_span(semconv.SPAN_DETOKENIZE, handle.context(), start_ns, end_ns, call.attributes(), error)
        return
    scope = get_scope()
    if scope is not None and (target := _deferred_request(scope)) is not None:
        target.detokenized(duration)
        if (text := capture_text(call.result)) is not None:
            finish = scope.deferred.get(id(target))
            if finish is not None and finish.completion is None:
                finish.completion = text
        live_span(semconv.SPAN_DETOKENIZE, target.context(), start_ns, end_ns, call.attributes(), error)
        return
    if scope is not None and (streaming := _last_open(scope)) is not None:
        # Incremental detokenization while a streamed response is produced (the handler
        # decodes each token as it arrives): time added to the request, never a span per token.
        streaming.detokenized(duration)
        return
    if _current_span_recording() and (error is not None or call.tokens() > INCREMENTAL_DECODE_MAX_TOKENS):
        live_span(semconv.SPAN_DETOKENIZE, None, start_ns, end_ns, call.attributes(), error)


def _last_open(scope: ServerScope) -> Any:
    """The call's last request still open (None: none is)."""
    for handle in reversed(scope.handles):
        if handle.finish_ns is None:
            return handle
    return None


def _deferred_request(scope: ServerScope) -> Any:
    for handle in reversed(scope.handles):
        if handle.finish_ns is None and id(handle) in scope.deferred:
            return handle
    return None


def emit_pending(scope: ServerScope) -> None:
    """Unclaimed encodes of a finished server call: ``llm.tokenize`` under the SERVER span."""
    for item in scope.take_pending():
        live_span(semconv.SPAN_TOKENIZE, scope.context, item.start_ns, item.end_ns,
                  _tokenize_attrs(item.tokens, item.batch, item.tokenizer_class), offset=scope.wall_offset_ns)


# --------------------------------------------------------------------------- wrappers
def bound_argument(func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   instance: Any = None) -> Any:
    """The argument *name* of a call to *func*, bound by name (``inspect.signature``)."""
    import inspect

    signature = inspect.signature(func)
    call_args = (instance, *args) if instance is not None else args
    bound = signature.bind_partial(*call_args, **kwargs)
    return bound.arguments.get(name)


def _reporting(original: Any, after: Any) -> Callable[..., Any]:
    """The function that times one user-level call of *original* and reports it through *after*."""

    def report(self: Any, *args: Any, **kwargs: Any) -> Any:
        """A user-level call that something records, timed and reported; the caller makes its
        nested calls pass through (a flag set around this call)."""
        start = monotonic_ns()
        try:
            result = original(self, *args, **kwargs)
        except Exception as exc:  # the call's failure, reported; an interrupt is not
            after(original, self, args, kwargs, None, start, exc)
            raise
        after(original, self, args, kwargs, result, start, None)
        return result

    return report


def _timed_tokenizer_method(after: Any | None, observed: Callable[[], bool] | None = None,
                            reporting: Callable[[Any], Callable[..., Any]] | None = None,
                            failed: Callable[..., None] | None = None) -> Callable[[Any], Any]:
    """``make(original)`` for :meth:`~llmtrace.integrations._base.Patches.replace`: a tokenizer
    method *original* in a plain function that times one user-level call (nested calls pass
    straight through), then reports through *after(original, instance, args, kwargs, result,
    start_ns, error)*. When *observed* says nothing would record the call, it passes straight
    through too. A plain function rather than a wrapt proxy: a streamed response decodes once
    per token.

    Where llmtrace-native is built, the method put on the class is its compiled form
    (``tokenizer_method``, native/src/tokenizer_method.rs), which takes the pass-through cases
    itself — a nested call, an unobserved decode — hands an observed call to ``report``, the
    same timing the Python method does, with its own pass-through flag set around it (a flag of
    the thread's, cheaper than the context variable), and every call it cannot decide to this
    Python method, the reference: a streamed token at 0 % sampling costs no Python frame of
    llmtrace's. ``LLMTRACE_NATIVE_TOKENIZER=python`` keeps the Python method alone.
    *reporting(original)*, when given, makes that timing function instead of :func:`_reporting` (and
    *after* goes unused). *failed*, for an observed method, lets the compiled form time a call of a
    recording request itself (what *reporting*'s function would do: the duration added to the
    request's ``detokenize_ns``) and report a failed one through ``failed(elapsed_ns, error,
    instance, *args, **kwargs)``."""

    def make(original: Any) -> Any:
        report = reporting(original) if reporting is not None else _reporting(original, after)

        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = _in_tokenizer.set(True)
            try:
                return report(self, *args, **kwargs)
            finally:
                _in_tokenizer.reset(token)

        @functools.wraps(original)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _in_tokenizer.get():
                return original(self, *args, **kwargs)
            if observed is not None and not observed():
                # Still the user-level call: the calls nested in it (transformers' decode calls the
                # tokenizers one) pass straight through instead of asking again (~6k instructions
                # a streamed decode).
                token = _in_tokenizer.set(True)
                try:
                    return original(self, *args, **kwargs)
                finally:
                    _in_tokenizer.reset(token)
            return timed(self, *args, **kwargs)

        native = _native.chosen_by("LLMTRACE_NATIVE_TOKENIZER")
        if native is None:
            return method
        # The compiled method asks what _decode_observed asks first, from the same variables.
        compiled = native.tokenizer_method(original, report, method, _in_tokenizer,
                                           None if observed is None else (REQUEST_VAR, SCOPE_VAR),
                                           None if observed is None else failed)
        functools.update_wrapper(compiled, original)
        return compiled

    return make


def encode_method(count: Any, text_param: str) -> Callable[[Any], Any]:
    """``make(original)`` timing one user-level encode; *count(result, args, kwargs)* -> (tokens, batch)."""
    return _timed_tokenizer_method(functools.partial(_after_encode, count, text_param))


@guarded("tokenize.wrapper")
def _after_encode(count: Any, text_param: str, original: Any, instance: Any, args: tuple[Any, ...],
                  kwargs: dict[str, Any], result: Any, start_ns: int, error: BaseException | None) -> None:
    end = monotonic_ns()
    tokens, batch = count(result, args, kwargs) if error is None else (0, 0)
    text = None
    if _runtime.settings().capture_content:
        text = capture_text(bound_argument(original, text_param, args, kwargs, instance))
    record_tokenize(start_ns, end, tokens, batch, type(instance).__name__, text, error)


def decode_method(count: Any) -> Callable[[Any], Any]:
    """``make(original)`` timing one user-level decode; *count(args, kwargs)* -> tokens."""
    return _timed_tokenizer_method(None, _decode_observed, functools.partial(_decode_reporting, count),
                                   functools.partial(_decode_failed, count))


def _decode_failed(count: Any, elapsed_ns: int, error: BaseException, instance: Any, /, *args: Any,
                   **kwargs: Any) -> None:
    """A decode the compiled method timed that raised *error* after *elapsed_ns*: reported as the
    Python method reports it (:func:`record_detokenize`, the failed call's span)."""
    end = monotonic_ns()
    record_detokenize(end - elapsed_ns, end, DecodeCall(count, instance, args, kwargs, None, error))


def _decode_reporting(count: Any, original: Any) -> Callable[..., Any]:
    """:func:`_reporting` for a decode, with :func:`record_detokenize`'s common case written in: a
    streamed token of a sampled request (sixteen in a 16-token stream) adds its duration to the
    request it belongs to — the current one, else the call's last open one when none is deferred
    to the response's end — with no frame between; every other decode, and a failed one, goes
    to :func:`record_detokenize`."""

    def report(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        try:
            result = original(self, *args, **kwargs)
        except Exception as exc:  # the call's failure, reported; an interrupt is not
            record_detokenize(start, monotonic_ns(), DecodeCall(count, self, args, kwargs, None, exc))
            raise
        end = monotonic_ns()
        try:
            target = get_request()
            if target is None and (scope := get_scope()) is not None and not scope.deferred:
                for handle in reversed(scope.handles):  # the call's last open request
                    if handle.finish_ns is None:
                        target = handle
                        break
            if target is not None:
                target.detokenized(end - start)
                return result
        except Exception as exc:  # noqa: BLE001 - counted as record_detokenize would; never the host's error
            record_error("detokenize.wrapper", exc)
            return result
        record_detokenize(start, end, DecodeCall(count, self, args, kwargs, result, None))
        return result

    return report


def _decode_observed() -> bool:
    """Whether a decode now would end up in a recording span (see :func:`record_detokenize`).

    A decode's time only ever lands on spans (``llm.detokenize``, ``llm.detokenize.total_s``
    on ``llm.request``), never on metrics: for a request that sampling dropped — 90% of them
    at 10% sampling — a streamed response's per-token decodes run untimed (~5 µs a token
    saved, docs/performance.md). Never raises into the host's decode: when in doubt, time it."""
    try:
        handle = get_request()
        if handle is not None:
            return handle.recording
        scope = get_scope()
        if scope is not None:
            return scope.recording
        return _current_span_recording()
    except Exception as exc:  # noqa: BLE001 - counted; the decode is then timed as before
        record_error("detokenize.observed", exc)
        return True


def first_argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """The method's first parameter, called *name*, whether passed by position or by name.

    The cheap form of binding for wrappers on per-token paths, where
    ``inspect.signature(...).bind`` would cost more than the call it measures.
    """
    if args:
        return args[0]
    return kwargs.get(name)
