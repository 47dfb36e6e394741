"""The request lifecycle API: one engine-agnostic record per request.

Every adapter — the FastAPI handler, transformers ``generate()``, the reference
engine, vLLM — reports the same events through this module::

    arrived -> tokenized -> queued -> scheduled (in a step) -> token ... token
            -> [preempted -> queued -> scheduled ...] -> finished | aborted

The hot path only appends ``monotonic_ns()`` readings to lists. When the
request ends, the record is handed to the span builder, which computes TTFT,
TPOT and inter-token statistics and creates the phase spans with explicit
start/end times::

    llm.request  |--------------------------------------------------------|
    llm.tokenize |--|
    llm.queue       |-------|            |----|        (again after a preemption)
    llm.prefill             |-----|
    llm.decode                    |------------------------------------|

A request may be split across processes: the API server owns ``llm.request``
and the engine, given the request's W3C carrier, adds queue/prefill/decode to
the same trace (``owns_span=False``) and reports a :meth:`RequestHandle.summary`
back for the server to put on ``llm.request``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode

from llmtrace import _runtime, semconv
from llmtrace._otel.span_context import DIRECT_SPAN_CONTEXT
from llmtrace._safety import guarded
from llmtrace.lifecycle import emit
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.clock import monotonic_ns, offset_ns, to_wall_ns
from llmtrace.lifecycle.current import SPAN_KEY, current_context
from llmtrace.lifecycle.pending import RequestSpan
from llmtrace.lifecycle.phases import build_request_spans, first_token_summary, phase_summary
from llmtrace.lifecycle.propagation import carrier_of, extract, inject
from llmtrace.lifecycle.scope import current_scope

log = logging.getLogger("llmtrace")

_current_request: contextvars.ContextVar[RequestHandle | None] = contextvars.ContextVar(
    "llmtrace_current_request", default=None
)


class RequestHandle:
    """The record of one request; its methods are the lifecycle events.

    Every method is safe to call in any order and more than once; after
    :meth:`finished` or :meth:`aborted` further events are ignored.
    """

    __slots__ = (
        "_extra_tokens",
        "_reported_tokens",
        "_token",
        "arrival_ns",
        "attributes",
        "awaiting_schedule",
        "completion",
        "detokenize_ns",
        "error",
        "finish_ns",
        "finish_reason",
        "owns_span",
        "parent_context",
        "prompt",
        "prompt_cache",
        "prompt_tokens",
        "queued_ns",
        "recording",
        "remote_phases",
        "request_id",
        "scheduled_ns",
        "span",
        "spec_decode",
        "step_link",
        "step_records",
        "steps",
        "summary_in",
        "token_ns",
        "tokenize",
        "wall_offset_ns",
    )

    def __init__(
        self,
        request_id: str,
        *,
        arrival_ns: int,
        span: Span | None,
        parent_context: otel_context.Context | None,
        owns_span: bool,
        recording: bool,
        attributes: dict[str, Any],
        prompt_tokens: int | None,
        prompt: str | None,
        wall_offset_ns: int,
    ) -> None:
        self.request_id = request_id
        self.arrival_ns = arrival_ns
        #: The wall-minus-monotonic offset every span of this request is converted with (one
        #: offset per span tree keeps its nesting exact; see lifecycle/clock.py).
        self.wall_offset_ns = wall_offset_ns
        self.span = span
        self.parent_context = parent_context
        self.owns_span = owns_span
        self.recording = recording
        self.attributes = attributes
        self.prompt_tokens = prompt_tokens
        self.prompt = prompt
        self.tokenize: list[tuple[int, int, int]] = []
        self.queued_ns: list[int] = []
        self.scheduled_ns: list[int] = []
        self.steps: list[int] = []
        self.step_records: list[Any] = []  # StepRecords, only with GPU energy accounting
        #: The link every ``llm.step`` of this request carries to it: made once, by the span builder
        #: (a request is in hundreds of steps, and one object lets the encoder write it once too).
        self.step_link: Any = None
        self.token_ns: list[int] = []
        #: True while the request waits for a step: its next ``scheduled`` starts a run (the
        #: engine loop reads this one flag per request per step, not two list lengths).
        self.awaiting_schedule = True
        # Output tokens = one per token event plus these (an event of n > 1 tokens adds n - 1),
        # unless the adapter reported the count at the end: the per-step loop only appends.
        self._extra_tokens = 0
        self._reported_tokens: int | None = None
        self.detokenize_ns = 0  # (also added to by the compiled decode method: native/src/tokenizer_method.rs)
        #: (cached, transferred) prompt tokens, as the engine first reported them.
        self.prompt_cache: tuple[int, int] | None = None
        #: [draft tokens, accepted tokens] of speculative decoding, summed over the steps.
        self.spec_decode: list[int] | None = None
        self.finish_ns: int | None = None
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.completion: str | None = None
        self.summary_in: dict[str, Any] | None = None
        self.remote_phases = False
        self._token: contextvars.Token[RequestHandle | None] | None = None

    # ----------------------------------------------------------------- hot path events
    def tokenized(self, n_tokens: int, start_ns: int | None = None, end_ns: int | None = None) -> None:
        """The prompt was encoded into *n_tokens* (times default to now, as a zero-length span)."""
        end = monotonic_ns() if end_ns is None else end_ns
        self.tokenize.append((end if start_ns is None else start_ns, end, n_tokens))
        if self.prompt_tokens is None:
            self.prompt_tokens = n_tokens

    def queued(self, at_ns: int | None = None) -> None:
        """The request entered the scheduler's waiting queue."""
        if self.finish_ns is None and len(self.queued_ns) <= len(self.scheduled_ns):
            self.queued_ns.append(monotonic_ns() if at_ns is None else at_ns)
            self._update_awaiting()

    def scheduled(self, step_id: int | None = None, at_ns: int | None = None) -> None:
        """The request is in the running batch (call once per step it is in, or once)."""
        if self.finish_ns is not None:
            return
        if self.awaiting_schedule:
            self.scheduled_ns.append(monotonic_ns() if at_ns is None else at_ns)
            self._update_awaiting()
        if step_id is not None:
            self.steps.append(step_id)

    def token(self, n: int = 1, at_ns: int | None = None) -> None:
        """*n* output tokens appeared (one timestamp per call: a streamed chunk is one event)."""
        if self.finish_ns is None:
            self.token_ns.append(monotonic_ns() if at_ns is None else at_ns)
            self._extra_tokens += n - 1

    def preempted(self, at_ns: int | None = None) -> None:
        """The request left the running batch and waits again (its KV cache was freed)."""
        if self.finish_ns is None and len(self.scheduled_ns) >= len(self.queued_ns):
            self.queued_ns.append(monotonic_ns() if at_ns is None else at_ns)
            self._update_awaiting()

    def _update_awaiting(self) -> None:
        # Each queue wait pairs with the schedule that ends it; a request scheduled without
        # ever being queued still gets its first schedule.
        self.awaiting_schedule = len(self.scheduled_ns) < max(1, len(self.queued_ns))

    @property
    def output_tokens(self) -> int:
        """Output tokens so far: the adapter's final count when it gave one, else counted events."""
        if self._reported_tokens is not None:
            return self._reported_tokens
        return len(self.token_ns) + self._extra_tokens

    @output_tokens.setter
    def output_tokens(self, count: int) -> None:  # an adapter that knows the exact count says so
        self._reported_tokens = count

    def prompt_cached(self, cached: int, transferred: int = 0) -> None:
        """The engine served *cached* prompt tokens from its prefix cache and received
        *transferred* by KV transfer; it computed the rest. The first report counts (a
        request recomputed after preemption reports its first admission)."""
        if self.prompt_cache is None and cached >= 0 and transferred >= 0:
            self.prompt_cache = (cached, transferred)

    def speculated(self, draft_tokens: int, accepted_tokens: int) -> None:
        """One verify step of speculative decoding: *draft_tokens* proposed, *accepted_tokens* kept."""
        counts = self.spec_decode
        if counts is None:
            self.spec_decode = [draft_tokens, accepted_tokens]
        else:
            counts[0] += draft_tokens
            counts[1] += accepted_tokens

    def detokenized(self, duration_ns: int) -> None:
        """Time spent turning output tokens into text (incremental or final)."""
        self.detokenize_ns += duration_ns

    # ----------------------------------------------------------------- endings
    def finished(self, reason: str = semconv.FINISH_STOP, output_tokens: int | None = None,
                 completion: str | None = None, at_ns: int | None = None) -> None:
        """The request completed normally (*reason*: stop, length, ...)."""
        self._end(reason, None, output_tokens, completion, at_ns)

    def aborted(self, error: BaseException | None = None, reason: str | None = None,
                at_ns: int | None = None) -> None:
        """The request ended early: client disconnect (``abort``) or an exception (``error``)."""
        if reason is None:
            reason = semconv.FINISH_ERROR if error is not None else semconv.FINISH_ABORT
        self._end(reason, error, None, None, at_ns)

    @guarded("request.end")
    def _end(self, reason: str, error: BaseException | None, output_tokens: int | None,
             completion: str | None, at_ns: int | None) -> None:
        if self.finish_ns is not None:
            return
        self.finish_ns = monotonic_ns() if at_ns is None else at_ns
        self.finish_reason = reason
        self.error = error
        if output_tokens is not None:
            self._reported_tokens = output_tokens
        self.completion = completion
        if self.recording:
            BUILDER.submit(self._materialise)
        elif self.owns_span and (metrics := _runtime.serving_metrics()) is not None:
            # Most requests in production are unsampled: nothing to build but their metrics
            # (recorded by the process that owns ``llm.request``; an engine behind an API server
            # does not). Where recording them is a few list appends, they are recorded here: the
            # builder's queue and a wake-up of its thread cost more than the appends.
            if metrics.records_inline:
                metrics.record_request(self)
            else:
                BUILDER.submit(self._materialise)

    def _materialise(self) -> None:
        metrics = _runtime.serving_metrics()
        if metrics is not None and self.owns_span:
            metrics.record_request(self)
        if self.recording:
            build_request_spans(self, emit.current(), _runtime.settings())

    # ----------------------------------------------------------------- cross-process
    def engine_summary(self, summary: Mapping[str, Any]) -> None:
        """Attach phase timings measured by an engine in another process (see :meth:`summary`)."""
        self.summary_in = dict(summary)
        self.remote_phases = True

    def handed_to_engine(self) -> None:
        """The request went to an engine in another process, which emits its queue/prefill/decode
        spans; this side must not derive its own (also when the request is aborted before the
        engine reports back)."""
        self.remote_phases = True

    def summary(self) -> dict[str, Any]:
        """Durations (never timestamps) an engine sends back to the server that owns ``llm.request``."""
        return phase_summary(self)

    def first_token_summary(self) -> dict[str, Any]:
        """The part of :meth:`summary` that is final at the first token (queue, prefill,
        preemptions, first step, prompt cache), without computing the rest."""
        return first_token_summary(self)

    # ----------------------------------------------------------------- scope
    def context(self) -> otel_context.Context:
        """The OTel context in which this request's child spans belong."""
        if self.span is not None:
            return trace.set_span_in_context(self.span, self.parent_context)
        return self.parent_context or otel_context.get_current()

    def carrier(self) -> dict[str, str]:
        """W3C ``traceparent``/``tracestate`` of the request span, for another process."""
        if self.span is not None:  # what context() would hold, without building it (once per request)
            return carrier_of(self.span.get_span_context())
        return inject(self.context())

    @contextmanager
    def activate(self) -> Iterator[RequestHandle]:
        """Make this the current request (and its span the current span) in this context."""
        token = _current_request.set(self)
        ctx_token = otel_context.attach(self.context())
        try:
            yield self
        finally:
            otel_context.detach(ctx_token)
            _current_request.reset(token)

    def __enter__(self) -> RequestHandle:
        self._token = _current_request.set(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._token is not None:
            _current_request.reset(self._token)
            self._token = None
        if exc is not None:
            # A closed generator or a cancelled task is the caller going away (a client that
            # disconnected, an RPC cancelled): ``abort``. Anything else is the request failing.
            self.aborted(None if isinstance(exc, (GeneratorExit, asyncio.CancelledError)) else exc)
        else:
            self.finished()


def current_request() -> RequestHandle | None:
    """The request whose scope this code runs in, if any (contextvars: survives asyncio tasks)."""
    return _current_request.get()


#: The context variable itself, for compiled hooks that read it (llmtrace-native's tokenizer methods).
REQUEST_VAR = _current_request
#: :func:`current_request` as the context variable's own method, without a Python frame: for
#: hooks asked once per streamed token.
get_request: Callable[[], RequestHandle | None] = _current_request.get


def _request_attributes(model: str | None, max_tokens: int | None, temperature: float | None,
                        top_p: float | None, operation: str, stream: bool | None,
                        request_id: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.GEN_AI_OPERATION_NAME: operation, semconv.LLM_REQUEST_ID: request_id,
                             semconv.GEN_AI_RESPONSE_ID: request_id}
    for key, value in ((semconv.GEN_AI_REQUEST_MODEL, model), (semconv.GEN_AI_REQUEST_MAX_TOKENS, max_tokens),
                       (semconv.GEN_AI_REQUEST_TEMPERATURE, temperature), (semconv.GEN_AI_REQUEST_TOP_P, top_p),
                       (semconv.LLM_STREAM, stream)):
        if value is not None:
            attrs[key] = value
    if extra:
        attrs.update(extra)
    return attrs


def start_request(
    request_id: str | None = None,
    *,
    model: str | None = None,
    prompt_tokens: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    stream: bool | None = None,
    operation: str = "text_completion",
    carrier: Mapping[str, str] | str | None = None,
    owns_span: bool = True,
    prompt: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    arrival_ns: int | None = None,
) -> RequestHandle:
    """A request arrived: open its record (and its ``llm.request`` span when *owns_span*).

    The span is a child of *carrier*'s context when given (another process's
    ``llm.request``), else of the current span (e.g. the SERVER span of the
    network handler) — never a sibling of it.
    """
    rid = request_id or uuid.uuid4().hex
    arrival = monotonic_ns() if arrival_ns is None else arrival_ns
    parent = extract(carrier) if carrier else current_context()
    found_parent = None if owns_span else _parent_span(parent)
    if carrier and found_parent is not None and not found_parent[1]:
        owns_span = True  # the carrier was unusable (logged): no other process's span to hang the phases on
    settings = _runtime.settings()
    attrs = _request_attributes(model, max_tokens, temperature, top_p, operation, stream, rid, attributes)
    text = prompt if settings.capture_content else None
    span: Span | None = None
    scope = current_scope()
    offset = scope.wall_offset_ns if scope is not None else offset_ns()  # the call's span tree's
    if owns_span:
        span = _unsampled_child(parent)
        if span is not None:
            recording = False
        else:
            span = _request_span(parent, attrs) or _runtime.tracer().start_span(
                semconv.SPAN_REQUEST, context=parent, kind=SpanKind.INTERNAL, start_time=to_wall_ns(arrival, offset),
                attributes=attrs)
            recording = span.is_recording()
    else:
        recording = found_parent is not None and found_parent[2]  # (always computed above in this case)
    handle = RequestHandle(rid, arrival_ns=arrival, span=span, parent_context=parent, owns_span=owns_span,
                           recording=recording, attributes=attrs, prompt_tokens=prompt_tokens, prompt=text,
                           wall_offset_ns=offset)
    # A request opened while a network handler serves a call belongs to that call:
    # a client disconnect ends it as ``abort`` (see lifecycle/scope.py).
    if owns_span and scope is not None:
        scope.register(handle)
    return handle


def _parent_span(parent: otel_context.Context) -> tuple[SpanContext | None, bool, bool]:
    """The context of the span in *parent*, whether it is valid and whether sampled — what
    ``get_current_span(parent).get_span_context()`` would say — without the API's frames (asked
    once per request). ``(None, False, False)`` when *parent* holds no span."""
    span = parent.get(SPAN_KEY)
    if span is None:
        return None, False, False
    try:  # (not an ABC isinstance check: that is a frame of its own)
        found: SpanContext = span.get_span_context()  # type: ignore[attr-defined]  # (the API's own read)
    except AttributeError:  # not a span: the API sees none
        return None, False, False
    if type(found) is SpanContext and DIRECT_SPAN_CONTEXT:
        _, _, _, flags, _, valid = found  # its fields without a property frame each
        return found, valid, flags & 1 == 1
    return found, found.is_valid, found.trace_flags.sampled


def in_span() -> bool:
    """Whether the current context holds a valid span (a SERVER span, the caller's), as
    ``trace.get_current_span().get_span_context().is_valid`` says, without the API's frames
    (asked once per request by an adapter that joins a propagated context only where there is none)."""
    return _parent_span(current_context())[1]


def _unsampled_child(parent: otel_context.Context) -> Span | None:
    """The span the SDK's parent-based sampler would give a child of an unsampled parent — a
    non-recording span with a fresh id — without its sampler call (most requests in production
    are not sampled); None where the SDK must decide (a sampled or no parent, another tracer)."""
    parent_context, valid, sampled = _parent_span(parent)
    if parent_context is None or not valid or sampled:
        return None
    spans = emit.current()
    if not isinstance(spans, emit.SdkFinishedSpans):
        return None
    return trace.NonRecordingSpan(spans.new_context(parent_context, semconv.SPAN_REQUEST, SpanKind.INTERNAL)[0])


def _request_span(parent: otel_context.Context, attributes: dict[str, Any]) -> Span | None:
    """``llm.request`` under *parent* as a :class:`RequestSpan`, built finished when the request ends
    (lifecycle/pending.py): the ids and sampling decision the SDK would give it, without its live
    span. None where the SDK must decide: another tracer, or no parent and a sampler llmtrace cannot
    read directly."""
    spans = emit.current()
    if not isinstance(spans, emit.SdkFinishedSpans):
        return None
    found, valid, _ = _parent_span(parent)
    parent_context = found if valid else None
    if parent_context is None and not spans.reads_root_sampler:
        return None
    context, sampled = spans.new_context(parent_context, semconv.SPAN_REQUEST, SpanKind.INTERNAL)
    if not sampled:
        return trace.NonRecordingSpan(context)
    return RequestSpan(context, parent_context, dict(attributes), spans)


def mark_error(span: Span, error: BaseException) -> None:
    span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.record_exception(error)
