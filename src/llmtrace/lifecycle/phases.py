"""From a finished request record to its phase intervals, attributes and spans.

Pure functions over :class:`~llmtrace.lifecycle.request.RequestHandle` data,
run by the span builder off the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from llmtrace import semconv
from llmtrace._gpu_hook import span_attributes_for
from llmtrace.config import Settings
from llmtrace.lifecycle.clock import to_wall_ns
from llmtrace.lifecycle.emit import FinishedSpans, SdkFinishedSpans
from llmtrace.lifecycle.pending import RequestSpan
from llmtrace.lifecycle.stats import NS, token_timing

if TYPE_CHECKING:
    from llmtrace.lifecycle.request import RequestHandle


_UNSET = Status(StatusCode.UNSET)


@dataclass(frozen=True)
class Phases:
    """Monotonic intervals of one request's phases."""

    queues: list[tuple[int, int]]
    prefill: tuple[int, int] | None
    decode: tuple[int, int] | None
    stall_ns: int


def compute_phases(rec: RequestHandle) -> Phases:
    """Queue waits pair each ``queued`` with the next ``scheduled``; prefill runs from the
    first schedule to the first token; decode from the first token to the last one (or to
    the end, for a request aborted mid-decode). Waits after the first token are decode stalls."""
    end = rec.finish_ns if rec.finish_ns is not None else rec.arrival_ns
    queues: list[tuple[int, int]] = []
    for i, start in enumerate(rec.queued_ns):
        stop = rec.scheduled_ns[i] if i < len(rec.scheduled_ns) else end
        queues.append((start, max(start, stop)))
    first_sched = rec.scheduled_ns[0] if rec.scheduled_ns else None
    first_tok = rec.token_ns[0] if rec.token_ns else None
    prefill = None
    if first_sched is not None:
        prefill = (first_sched, first_tok if first_tok is not None else end)
    decode = None
    if first_tok is not None and (len(rec.token_ns) > 1 or rec.finish_reason in ("abort", "error")):
        last = rec.token_ns[-1] if rec.finish_reason not in ("abort", "error") else end
        decode = (first_tok, max(first_tok, last))
    stall = sum(b - a for a, b in queues if first_tok is not None and a >= first_tok)
    return Phases(queues, prefill, decode, stall)


def queue_ns(rec: RequestHandle) -> int:
    """The sum of :func:`compute_phases`' queue waits, without the rest (metrics ask it of every request)."""
    queued, scheduled = rec.queued_ns, rec.scheduled_ns
    end = rec.finish_ns if rec.finish_ns is not None else rec.arrival_ns
    total = 0
    for i, start in enumerate(queued):
        stop = scheduled[i] if i < len(scheduled) else end
        if stop > start:
            total += stop - start
    return total


def phase_summary(rec: RequestHandle, phases: Phases | None = None) -> dict[str, Any]:
    """Durations an engine reports back to the process owning ``llm.request`` (*phases*: the record's
    :func:`compute_phases`, when the caller has it already)."""
    if phases is None:
        phases = compute_phases(rec)
    summary: dict[str, Any] = {
        "queue_s": sum(b - a for a, b in phases.queues) * NS,
        "preemptions": max(0, len(rec.queued_ns) - 1),
        "decode_stall_s": phases.stall_ns * NS,
    }
    if phases.prefill:
        summary["prefill_s"] = (phases.prefill[1] - phases.prefill[0]) * NS
    if phases.decode:
        summary["decode_s"] = (phases.decode[1] - phases.decode[0]) * NS
    if rec.steps:
        summary["first_step"], summary["last_step"] = rec.steps[0], rec.steps[-1]
        first_tok = rec.token_ns[0] if rec.token_ns else None
        summary["decode_steps"] = max(0, len(rec.steps) - 1) if first_tok is not None else 0
    if rec.prompt_cache is not None:
        summary["cached_tokens"], summary["transferred_tokens"] = rec.prompt_cache
    if rec.spec_decode is not None:
        summary["draft_tokens"], summary["accepted_tokens"] = rec.spec_decode
    if rec.step_records:
        from llmtrace.lifecycle.energy import request_energy_j

        if (energy := request_energy_j(rec)) is not None:
            summary["energy_j"] = energy
    return summary


def first_token_summary(rec: RequestHandle) -> dict[str, Any]:
    """The part of :func:`phase_summary` that is final at a request's first token (queue waits,
    prefill, preemptions, first step, prompt cache), computed without the rest: an engine sends
    it with every request's first token, sampled or not."""
    summary: dict[str, Any] = {"queue_s": queue_ns(rec) * NS, "preemptions": max(0, len(rec.queued_ns) - 1)}
    if rec.scheduled_ns:
        # compute_phases' prefill: from the first schedule to the first token (or the end).
        if rec.token_ns:
            prefill_end = rec.token_ns[0]
        else:
            prefill_end = rec.finish_ns if rec.finish_ns is not None else rec.arrival_ns
        summary["prefill_s"] = (prefill_end - rec.scheduled_ns[0]) * NS
    if rec.steps:
        summary["first_step"] = rec.steps[0]
    if rec.prompt_cache is not None:
        summary["cached_tokens"], summary["transferred_tokens"] = rec.prompt_cache
    return summary


def _latency_attributes(rec: RequestHandle, phases: Phases | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    end = rec.finish_ns or rec.arrival_ns
    attrs[semconv.GEN_AI_LATENCY_E2E] = (end - rec.arrival_ns) * NS
    timing = token_timing(rec.arrival_ns, rec.token_ns)
    pairs = ((semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN, timing.ttft_s), (semconv.LLM_TTFT_S, timing.ttft_s),
             (semconv.LLM_TPOT_S, timing.tpot_s), (semconv.LLM_ITL_MEAN_S, timing.itl_mean_s),
             (semconv.LLM_ITL_P50_S, timing.itl_p50_s), (semconv.LLM_ITL_P99_S, timing.itl_p99_s),
             (semconv.LLM_ITL_MAX_S, timing.itl_max_s))
    attrs.update({k: v for k, v in pairs if v is not None})
    summary = rec.summary_in or (phase_summary(rec, phases) if rec.queued_ns or rec.scheduled_ns else {})
    for key, attr in (("queue_s", semconv.GEN_AI_LATENCY_TIME_IN_QUEUE),
                      ("prefill_s", semconv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL),
                      ("decode_s", semconv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE),
                      ("preemptions", semconv.LLM_PREEMPTIONS),
                      ("decode_stall_s", semconv.LLM_DECODE_STALL_S),
                      ("decode_steps", semconv.LLM_DECODE_STEPS),
                      ("first_step", semconv.LLM_STEP_FIRST_ID),
                      ("last_step", semconv.LLM_STEP_LAST_ID),
                      ("energy_j", semconv.LLM_ENERGY_J)):
        if key in summary:
            attrs[attr] = summary[key]
    attrs.update(_provenance_attributes(rec, summary))
    return attrs


def prompt_cache_of(rec: RequestHandle) -> tuple[int, int] | None:
    """(cached, transferred) prompt tokens: from this process's record, or from the engine's
    summary when the engine runs in another process; None when no engine said."""
    if rec.prompt_cache is not None:
        return rec.prompt_cache
    summary = rec.summary_in
    if summary and "cached_tokens" in summary:
        return int(summary["cached_tokens"]), int(summary.get("transferred_tokens", 0))
    return None


def _provenance_attributes(rec: RequestHandle, summary: dict[str, Any]) -> dict[str, Any]:
    """Where the prompt's KV came from, and what speculative decoding kept."""
    attrs: dict[str, Any] = {}
    cache = prompt_cache_of(rec)
    if cache is not None:
        cached, transferred = cache
        attrs[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = cached + transferred
        attrs[semconv.LLM_PROMPT_TOKENS_CACHED] = cached
        attrs[semconv.LLM_PROMPT_TOKENS_TRANSFERRED] = transferred
        if rec.prompt_tokens is not None:
            attrs[semconv.LLM_PROMPT_TOKENS_COMPUTED] = max(0, rec.prompt_tokens - cached - transferred)
    spec = rec.spec_decode
    if spec is None and "draft_tokens" in summary:
        spec = [int(summary["draft_tokens"]), int(summary.get("accepted_tokens", 0))]
    if spec is not None and spec[0] > 0:
        attrs[semconv.LLM_SPEC_DRAFT_TOKENS], attrs[semconv.LLM_SPEC_ACCEPTED_TOKENS] = spec
        attrs[semconv.LLM_SPEC_ACCEPTANCE_RATE] = spec[1] / spec[0]
    return attrs


def request_attributes(rec: RequestHandle, phases: Phases | None, settings: Settings) -> dict[str, Any]:
    """``llm.request``'s attributes at its end (*phases*: the record's :func:`compute_phases`, or None)."""
    attrs = _latency_attributes(rec, phases)
    if rec.prompt_tokens is not None:
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = rec.prompt_tokens
    attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = rec.output_tokens
    # An adapter that knows one reason per sequence (a batched generate()) leaves them in
    # rec.attributes; an abort or error overrides them.
    per_sequence = rec.attributes.get(semconv.GEN_AI_RESPONSE_FINISH_REASONS)
    if per_sequence and rec.finish_reason not in (semconv.FINISH_ABORT, semconv.FINISH_ERROR):
        attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = list(per_sequence)
    else:
        attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = [rec.finish_reason or semconv.FINISH_STOP]
    attrs[semconv.LLM_REQUEST_FINISH_REASON] = rec.finish_reason or semconv.FINISH_STOP
    if rec.detokenize_ns:
        attrs[semconv.LLM_DETOKENIZE_TOTAL_S] = rec.detokenize_ns * NS
    if settings.capture_content:
        limit = settings.capture_content_max_chars
        if rec.prompt is not None:
            attrs[semconv.GEN_AI_PROMPT] = rec.prompt[:limit]
        if rec.completion is not None:
            attrs[semconv.GEN_AI_COMPLETION] = rec.completion[:limit]
    return attrs


class _Children:
    """A request's child spans: through *spans*' ``open``/``close``, or — with the SDK's emitter — built
    finished and handed to the processors together with ``llm.request`` (``SdkFinishedSpans.end_all``)."""

    __slots__ = ("done", "offset", "parent", "sdk", "spans")

    def __init__(self, spans: FinishedSpans, parent: trace.SpanContext, offset: int) -> None:
        self.spans, self.parent, self.offset = spans, parent, offset
        self.sdk = spans if isinstance(spans, SdkFinishedSpans) else None
        self.done: list[ReadableSpan] = []

    def add(self, name: str, start: int, end: int, attributes: dict[str, Any] | None = None) -> None:
        wall_start, wall_end = to_wall_ns(start, self.offset), to_wall_ns(max(start, end), self.offset)
        if self.sdk is not None:
            if (finished := self.sdk.child(name, self.parent, wall_start, wall_end, attributes)) is not None:
                self.done.append(finished)
        elif (span := self.spans.open(name, self.parent, wall_start, attributes)) is not None:
            self.spans.close(span, wall_end)

    def end(self) -> None:
        if self.sdk is not None and self.done:
            self.sdk.end_all(self.done)


def _gpu_attributes(rec: RequestHandle) -> dict[str, Any]:
    return span_attributes_for(rec.arrival_ns, rec.finish_ns or rec.arrival_ns)


def _in_process_phases(rec: RequestHandle, phases: Phases) -> Phases:
    """*phases* of a request nobody scheduled explicitly (a handler that streams tokens itself):
    prefill runs from the end of tokenization (or arrival) to the first token."""
    if phases.prefill is None and rec.token_ns:
        start = rec.tokenize[-1][1] if rec.tokenize else rec.arrival_ns
        phases = Phases(phases.queues, (min(start, rec.token_ns[0]), rec.token_ns[0]), phases.decode,
                        phases.stall_ns)
    return phases


def build_request_spans(rec: RequestHandle, spans: FinishedSpans, settings: Settings) -> None:
    """Create the phase spans (and finish ``llm.request`` when this process owns it).

    When an engine in another process reported a summary, it has already put
    queue/prefill/decode in this trace; this side adds only its own spans.
    """
    computed = compute_phases(rec)
    phases = _in_process_phases(rec, computed)
    parent = rec.span.get_span_context() if rec.span is not None else \
        trace.get_current_span(rec.context()).get_span_context()
    children = _Children(spans, parent, rec.wall_offset_ns)
    for start, end, tokens in rec.tokenize:
        children.add(semconv.SPAN_TOKENIZE, start, end, {semconv.LLM_TOKENIZE_TOKENS: tokens})
    if rec.remote_phases:
        phases = Phases([], None, None, 0)
    for index, (start, end) in enumerate(phases.queues):
        children.add(semconv.SPAN_QUEUE, start, end, {semconv.LLM_QUEUE_INDEX: index})
    if phases.prefill:
        prefill_attrs = {semconv.GEN_AI_USAGE_INPUT_TOKENS: rec.prompt_tokens} if rec.prompt_tokens else None
        children.add(semconv.SPAN_PREFILL, *phases.prefill, prefill_attrs)
    if phases.decode:
        children.add(semconv.SPAN_DECODE, *phases.decode, {semconv.GEN_AI_USAGE_OUTPUT_TOKENS: rec.output_tokens})
    span: Span | None = rec.span
    if span is None or not rec.owns_span:
        children.end()
        return
    # One set_attributes call: each takes the span's lock and walks the SDK's value checks.
    attrs = request_attributes(rec, computed, settings)
    attrs.update(_gpu_attributes(rec))
    span.set_attributes(attrs)
    if rec.finish_reason == semconv.FINISH_ERROR or rec.error is not None:
        error = rec.error
        span.set_status(Status(StatusCode.ERROR, type(error).__name__ if error else "error"))
        if error is not None:
            span.record_exception(error)
    elif rec.finish_reason == semconv.FINISH_ABORT:
        span.set_status(Status(StatusCode.ERROR, "aborted"))
    end_ns = to_wall_ns(rec.finish_ns or rec.arrival_ns, rec.wall_offset_ns)
    if not isinstance(span, RequestSpan):
        children.end()
        span.end(end_time=end_ns)
        return
    finished = _finished_request_span(span, to_wall_ns(rec.arrival_ns, rec.wall_offset_ns), end_ns)
    if span.emitter is children.sdk:
        children.done.append(finished)
        children.end()
    else:  # the tracer provider changed while the request ran
        children.end()
        span.emitter.end_all([finished])


def _finished_request_span(span: RequestSpan, start_ns: int, end_ns: int) -> ReadableSpan:
    """The finished ``llm.request`` as the SDK's live span would have ended it; the stand-in then stops
    recording, as an ended span does."""
    span._recording = False
    emitter: SdkFinishedSpans = span.emitter
    return emitter.finished(span.name or semconv.SPAN_REQUEST, span.get_span_context(), span.parent,
                            SpanKind.INTERNAL, start_ns, end_ns, emitter.attributes(dict(span.attributes or {})),
                            span.status or _UNSET, span.events or (), span.links or ())


def server_timing(rec: RequestHandle) -> list[tuple[str, float]]:
    """``(name, seconds)`` of the phases known for *rec* so far — queue, prefill, decode and
    the time to first token — for a response's ``Server-Timing`` header. The engine's own
    summary wins where it reported one (another process measured the phases)."""
    summary = rec.summary_in or (phase_summary(rec) if rec.queued_ns or rec.scheduled_ns else {})
    entries = [(name, float(summary[key])) for name, key in (("queue", "queue_s"), ("prefill", "prefill_s"),
                                                              ("decode", "decode_s")) if key in summary]
    if rec.token_ns:
        entries.append(("ttft", (rec.token_ns[0] - rec.arrival_ns) * NS))
    return entries
