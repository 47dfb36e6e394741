"""Finished spans: the SDK fast path emits what the tracer API would, and respects sampling."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from llmtrace._otel.providers import LLMTraceSampler
from llmtrace.lifecycle import emit
from llmtrace.lifecycle.emit import ApiFinishedSpans, FinishedSpans, SdkFinishedSpans

LINKED = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


RESOURCE = Resource.create({"service.name": "emit-test"})


def _provider(sampler: Any = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE, sampler=sampler or LLMTraceSampler(1.0))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _tree(spans: FinishedSpans) -> None:
    """A window root, a step with a link, a phase: the shape the span builder emits."""
    root = spans.open("llm.engine", None, 1_000, {"llm.engine.id": "e0"})
    assert root is not None
    step = spans.open("llm.step", root.get_span_context(), 1_100, {"llm.step.id": 7, "ids": ["a", "b"]},
                      [Link(LINKED, {"llm.step.id": 7})])
    assert step is not None
    phase = spans.open("llm.forward", step.get_span_context(), 1_200, {"llm.step.id": 7}, kind=SpanKind.CLIENT)
    assert phase is not None
    spans.close(phase, 1_300)
    spans.close(step, 1_400)
    spans.close(root, 1_500)


def _attrs(attributes: Any) -> dict[str, Any]:
    # The SDK freezes list values into tuples; both encode to the same OTLP array.
    return {k: tuple(v) if isinstance(v, list) else v for k, v in (attributes or {}).items()}


def _shape(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    by_id = {s.context.span_id: s.name for s in spans}
    return sorted(
        (s.name, by_id.get(s.parent.span_id) if s.parent else None, s.start_time, s.end_time, _attrs(s.attributes),
         [(lk.context, _attrs(lk.attributes)) for lk in s.links], s.kind, s.status.status_code,
         dict(s.resource.attributes), s.instrumentation_scope.name if s.instrumentation_scope else None,
         bool(s.context.trace_flags.sampled))
        for s in spans)


def test_the_sdk_path_emits_exactly_what_the_tracer_api_would() -> None:
    fast_provider, fast_out = _provider()
    slow_provider, slow_out = _provider()
    fast = emit.finished_spans(fast_provider.get_tracer("llmtrace"))
    slow = ApiFinishedSpans(slow_provider.get_tracer("llmtrace"))
    assert isinstance(fast, SdkFinishedSpans)
    _tree(fast)
    _tree(slow)
    fast_spans, slow_spans = list(fast_out.get_finished_spans()), list(slow_out.get_finished_spans())
    assert 3 == len(fast_spans)
    assert _shape(slow_spans) == _shape(fast_spans)
    assert 1 == len({s.context.trace_id for s in fast_spans})  # one trace, distinct span ids
    assert 3 == len({s.context.span_id for s in fast_spans})


def test_children_of_an_unsampled_parent_are_not_emitted() -> None:
    provider, exporter = _provider()
    spans = emit.finished_spans(provider.get_tracer("llmtrace"))
    unsampled = SpanContext(0x1, 0x2, is_remote=False, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    assert spans.open("llm.queue", unsampled, 10) is None
    assert [] == list(exporter.get_finished_spans())


def test_a_root_the_sampler_drops_is_not_emitted() -> None:
    provider, exporter = _provider(ParentBased(ALWAYS_OFF))
    spans = emit.finished_spans(provider.get_tracer("llmtrace"))
    assert isinstance(spans, SdkFinishedSpans)
    assert spans.open("llm.engine", None, 10) is None
    assert [] == list(exporter.get_finished_spans())


def test_a_sampler_that_is_not_parent_based_gets_the_api_path() -> None:
    """Only ParentBased samplers agree with "a child takes its parent's decision"."""
    for sampler in (ALWAYS_ON, TraceIdRatioBased(0.5)):
        provider, _ = _provider(sampler)
        assert isinstance(emit.finished_spans(provider.get_tracer("llmtrace")), ApiFinishedSpans)


def test_processors_added_later_by_the_host_see_the_spans() -> None:
    provider, exporter = _provider()
    spans = emit.finished_spans(provider.get_tracer("llmtrace"))
    later = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(later))
    _tree(spans)
    assert 3 == len(later.get_finished_spans()) == len(exporter.get_finished_spans())
