"""Serving metrics: GenAI server histograms plus llmtrace's queue, batch and GPU-idle numbers.

Recorded from the same records that become spans, so metrics and traces always agree: a
sampled request's by the span builder thread, with its spans; an unsampled one's where it ends,
when recording is list appends (llmtrace's aggregated histograms), else by the builder too.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, cast

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from llmtrace import semconv
from llmtrace._otel.histogram import MAX_PENDING, AggregatedHistogram, HistogramRecorder, HistogramRegistry, histogram
from llmtrace.lifecycle.phases import prompt_cache_of, queue_ns
from llmtrace.lifecycle.stats import NS, tpot_s

if TYPE_CHECKING:
    from llmtrace._otel.export import ExportStats
    from llmtrace.lifecycle.engine import WindowTotals
    from llmtrace.lifecycle.request import RequestHandle


#: Attributes of a serving histogram's key, in order: (operation, model, finish reason, token type,
#: engine id); a None is left out.
_KEY_ATTRIBUTES = (semconv.GEN_AI_OPERATION_NAME, semconv.GEN_AI_REQUEST_MODEL, "finish_reason",
                   semconv.GEN_AI_TOKEN_TYPE, semconv.LLM_ENGINE_ID)


def _key_attributes(key: Hashable) -> dict[str, Any]:
    values = cast(tuple[Any, ...], key)  # what ServingMetrics records
    return {name: value for name, value in zip(_KEY_ATTRIBUTES, values, strict=True) if value is not None}


class ServingMetrics:
    """The instruments of one process; one instance per ``instrument()``.

    The histograms are llmtrace's aggregated ones where it owns the MeterProvider (a list append
    per measurement, folded at export: :mod:`llmtrace._otel.histogram`), SDK instruments otherwise."""

    def __init__(self, meter: Meter, drops: ExportStats | None = None,
                 histograms: HistogramRegistry | None = None) -> None:
        def make(name: str, unit: str, description: str, buckets: tuple[float, ...]) -> HistogramRecorder:
            return histogram(meter, histograms, name, unit, description, buckets, _key_attributes)

        self._ttft = make(semconv.METRIC_TTFT, "s", "Time to first token", semconv.TTFT_BUCKETS)
        self._tpot = make(semconv.METRIC_TPOT, "s", "Time per output token", semconv.TPOT_BUCKETS)
        self._duration = make(semconv.METRIC_REQUEST_DURATION, "s", "Request duration",
                              semconv.REQUEST_DURATION_BUCKETS)
        self._tokens = make(semconv.METRIC_TOKEN_USAGE, "{token}", "Tokens per request", semconv.TOKEN_USAGE_BUCKETS)
        self._queue = make(semconv.METRIC_QUEUE_TIME, "s", "Time waiting for the scheduler",
                           semconv.REQUEST_DURATION_BUCKETS)
        self._batch = make(semconv.METRIC_BATCH_SIZE, "{request}", "Requests per engine step",
                           (1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        # Summed here and observed at collection: two SDK Counter.add calls a request (attribute
        # checks, hashing, a lock each) were most of what an unsampled request cost the span builder.
        # Requests append (prompt tokens, (cached, transferred), model) from any thread; the sums
        # are folded under a lock, as the aggregated histograms' are.
        self._prompt_tokens: dict[tuple[str, Any], int] = {}
        self._provenance_pending: list[tuple[int, tuple[int, int], Any]] = []
        self._provenance_lock = threading.Lock()
        #: Recording a request is a few list appends (see :meth:`record_request`): the request's
        #: own thread may do it (see ``RequestHandle._end``).
        self._all_recorders = (self._ttft, self._tpot, self._duration, self._tokens, self._queue, self._batch)
        self.records_inline = all(isinstance(recorder, AggregatedHistogram) for recorder in self._all_recorders)
        meter.create_observable_counter(
            semconv.METRIC_PROMPT_TOKENS, [self._observe_prompt_tokens], unit="{token}",
            description="Prompt tokens by where their KV came from: computed, prefix cache, KV transfer")
        self._errors = meter.create_counter(semconv.METRIC_INSTRUMENTATION_ERRORS, unit="{error}",
                                            description="Internal llmtrace errors (swallowed)")
        self._drops = drops
        self._idle_lock = threading.Lock()
        self._idle: dict[str, float] = {}
        meter.create_observable_gauge(semconv.METRIC_GPU_IDLE_RATIO, [self._observe_idle], unit="1",
                                      description="Share of the last engine window with no forward pass running")
        meter.create_observable_counter(semconv.METRIC_DROPPED_SPANS, [self._observe_drops], unit="{span}",
                                        description="Spans dropped by the export path, by reason")
        meter.create_observable_counter(semconv.METRIC_EXPORTED_SPANS, [self._observe_exported], unit="{span}",
                                        description="Spans the OTLP endpoint or file took (re-sent ones included)")
        meter.create_observable_counter(semconv.METRIC_SPILLED_SPANS, [self._observe_spilled], unit="{span}",
                                        description="Spans written to the spill while the OTLP endpoint failed")
        meter.create_observable_counter(semconv.METRIC_OVERHEAD_CPU, [self._observe_overhead], unit="s",
                                        description="CPU time of llmtrace's own threads (span builder, "
                                                    "span export) in this process")

    def record_error(self, site: str) -> None:
        self._errors.add(1, {"site": site})

    def record_request(self, rec: RequestHandle) -> None:
        operation = rec.attributes.get(semconv.GEN_AI_OPERATION_NAME, "text_completion")
        model = rec.attributes.get(semconv.GEN_AI_REQUEST_MODEL)
        key = (operation, model, None, None, None)
        if rec.token_ns:  # TTFT and TPOT only: the inter-token percentiles are the span's
            self._ttft.record(((rec.token_ns[0] - rec.arrival_ns) * NS, key))
            if (tpot := tpot_s(rec.token_ns)) is not None:
                self._tpot.record((tpot, key))
        end = rec.finish_ns or rec.arrival_ns
        self._duration.record(((end - rec.arrival_ns) * NS, (operation, model, rec.finish_reason or "", None, None)))
        if rec.prompt_tokens is not None:
            self._tokens.record((rec.prompt_tokens, (operation, model, None, "input", None)))
        self._tokens.record((rec.output_tokens, (operation, model, None, "output", None)))
        queue_s = rec.summary_in.get("queue_s") if rec.summary_in else None
        if queue_s is None and rec.queued_ns:
            queue_s = queue_ns(rec) * NS
        if queue_s is not None:
            self._queue.record((queue_s, key))
        if rec.prompt_tokens is not None and (cache := prompt_cache_of(rec)) is not None:
            self._provenance_pending.append((rec.prompt_tokens, cache, model))
        self._fold_if_full()

    def _fold_provenance(self) -> None:
        with self._provenance_lock:
            # Recorders only append: the first n items are exactly the ones copied (see
            # AggregatedHistogram.fold), so no request is lost to a concurrent append.
            pending = self._provenance_pending
            count = len(pending)
            items = pending[:count]
            del pending[:count]
            totals = self._prompt_tokens
            for prompt_tokens, (cached, transferred), model in items:
                computed = max(0, prompt_tokens - cached - transferred)
                for source, tokens in (("computed", computed), ("cached", cached), ("transferred", transferred)):
                    if tokens:
                        key = (source, model)
                        totals[key] = totals.get(key, 0) + tokens

    def _observe_prompt_tokens(self, options: CallbackOptions) -> list[Observation]:
        self._fold_provenance()
        observations = []
        for (source, model), total in list(self._prompt_tokens.items()):  # a copy: a fold may add a key
            attrs = {semconv.LLM_PROMPT_TOKEN_SOURCE: source}
            if model is not None:
                attrs[semconv.GEN_AI_REQUEST_MODEL] = model
            observations.append(Observation(total, attrs))
        return observations

    def record_window(self, engine_id: str, totals: WindowTotals) -> None:
        key = (None, None, None, None, engine_id)
        record = self._batch.record
        for size in totals.batch_sizes:
            record((size, key))
        self._fold_if_full()
        if totals.span_ns > 0 and totals.forward_seen:
            with self._idle_lock:
                self._idle[engine_id] = max(0.0, 1.0 - totals.busy_ns / totals.span_ns)

    def _fold_if_full(self) -> None:
        for recorder in self._all_recorders:  # (once per request: a tuple kept, not made)
            if len(recorder.pending) >= MAX_PENDING:
                recorder.fold()
        if len(self._provenance_pending) >= MAX_PENDING:
            self._fold_provenance()

    def _observe_idle(self, options: CallbackOptions) -> list[Observation]:
        with self._idle_lock:
            return [Observation(ratio, {semconv.LLM_ENGINE_ID: eid}) for eid, ratio in self._idle.items()]

    def _observe_drops(self, options: CallbackOptions) -> list[Observation]:
        from llmtrace.lifecycle.builder import BUILDER

        by_reason = dict(self._drops.dropped_by_reason) if self._drops else {}
        by_reason[semconv.DROP_BUILDER_BACKLOG] = BUILDER.dropped
        return [Observation(count, {semconv.DROP_REASON: reason}) for reason, count in by_reason.items()]

    def _observe_exported(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self._drops.exported if self._drops else 0)]

    def _observe_spilled(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self._drops.spilled if self._drops else 0)]

    def _observe_overhead(self, options: CallbackOptions) -> list[Observation]:
        from llmtrace.lifecycle.builder import BUILDER

        observations = [Observation(BUILDER.cpu_s, {semconv.LLMTRACE_WORKER: "span_builder"})]
        if self._drops is not None:
            observations.append(Observation(self._drops.cpu_s, {semconv.LLMTRACE_WORKER: "exporter"}))
        return observations
