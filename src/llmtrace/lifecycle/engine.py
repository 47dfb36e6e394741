"""The engine timeline: ``llm.engine`` windows of ``llm.step`` spans, built off the hot path.

A custom continuous-batching engine gets the whole engine trace with a few calls::

    engine = llmtrace.EngineTracer("dp0")          # one per scheduler / device group
    while running:
        step = engine.begin_step()
        with step.phase("schedule"):
            batch = scheduler.schedule()
        step.batch([r.id for r in batch], prefill_tokens=..., decode_tokens=..., waiting=..., running=...)
        with step.phase("forward"):
            logits = model(...)
        with step.phase("sample"):
            tokens = sample(logits)
        step.tokens([r.id for r in batch])             # one output token each
        engine.end_step(step)

In the tightest loops, ``step.mark("schedule")``, ``step.mark("forward")``, ... at the
phase boundaries record the same phases for ~40% less engine-thread time than ``with`` blocks.

The engine thread only takes timestamps and appends to lists (a few µs a step).
Steps are grouped in windows (``engine_window_s`` or ``engine_window_steps``,
whichever comes first). A window is sampled whole (``engine_sample_ratio``) so
that the gaps between its ``llm.forward`` spans — the GPU idle time — are
measurable; its spans are created by the span builder when the window closes::

    llm.engine  |=========================== window ===========================|
    llm.step      |--step 41--|   |--step 42--|  |--step 43--|
    llm.forward       |-----|         |-----|        |-----|
                             ^^^^^ GPU idle ^^^^
"""

from __future__ import annotations

import gc
import random
import threading
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import Link

from llmtrace import _native, _runtime, semconv
from llmtrace._gpu_hook import energy_available, span_attributes_for
from llmtrace._otel.gil import GilYield
from llmtrace._safety import guarded
from llmtrace.lifecycle import emit
from llmtrace.lifecycle.builder import BUILDER
from llmtrace.lifecycle.clock import monotonic_ns, offset_ns, to_wall_ns
from llmtrace.lifecycle.request import RequestHandle
from llmtrace.lifecycle.tracker import RequestTracker

PHASE_NAMES = {
    "schedule": semconv.SPAN_SCHEDULE,
    "forward": semconv.SPAN_FORWARD,
    "sample": semconv.SPAN_SAMPLE,
    "postprocess": semconv.SPAN_POSTPROCESS,
}
#: Request ids listed on ``llm.step`` (``llm.batch.request_ids``); the links carry the rest.
MAX_BATCH_IDS_ATTR = 64


class StepRecord:
    """One scheduler iteration: timestamps and batch numbers, nothing else on the hot path."""

    # Slots, every one set in __init__: a record is written a dozen times per step, and
    # slot stores beat instance-dict stores (measured; a dict with class-level defaults
    # made batch() 3x slower as each step's dict grew).
    __slots__ = ("_gpu_token", "_mark_name", "_mark_ns", "_phase_name", "_phase_start", "_timer", "attributes",
                 "cached_tokens", "counted", "decode_tokens", "end_ns", "energy_done", "energy_j", "engine",
                 "handles", "kv_cache_usage", "phases", "preempted", "prefill_tokens", "running", "sampled",
                 "size", "start_ns", "step_id", "waiting")

    def __init__(self, engine: EngineTracer, step_id: int, start_ns: int, sampled: bool = True) -> None:
        self.engine = engine
        self.step_id = step_id
        #: Whether the window this step began in becomes spans. When it does not, only the batch's
        #: requests matter (their queue times and step ids feed every request's metrics and summary):
        #: an integration may record them with :meth:`batch_requests` and skip the numbers that
        #: only the ``llm.step`` span shows.
        self.sampled = sampled
        #: Whether :meth:`batch` gave the batch's numbers (the span leaves out what was not given).
        self.counted = False
        self.start_ns = self.end_ns = start_ns
        self.phases: list[tuple[str, int, int]] = []
        self.handles: list[RequestHandle] = []
        #: Requests in the batch where the engine keeps records of only some of them (see
        #: :meth:`batch_handles`); None: the batch is its records.
        self.size: int | None = None
        self.prefill_tokens = self.decode_tokens = self.preempted = self.cached_tokens = 0
        self.waiting: int | None = None
        self.running: int | None = None
        self.kv_cache_usage: float | None = None
        self.attributes: dict[str, Any] | None = None
        self._phase_name = ""
        self._phase_start = 0
        self._mark_name: str | None = None
        self._mark_ns = 0
        self._gpu_token: Any = None
        self._timer: Any = engine.forward_timer  # CUDA-event ForwardTimer, when the engine has one
        self.energy_j: float | None = None  # filled lazily by lifecycle/energy.py
        self.energy_done = False

    @property
    def batch_size(self) -> int:
        """Requests in the batch: :attr:`size` where given, else the records."""
        return len(self.handles) if self.size is None else self.size

    def phase(self, name: str) -> StepRecord:
        """Time a phase (``schedule``, ``forward``, ``sample``, ``postprocess``) with ``with``.

        The step itself is the context manager (no allocation per phase); phases of one
        step are sequential, as in an engine loop, so they do not nest.
        """
        self._phase_name = name
        return self

    def __enter__(self) -> None:
        if self._timer is not None and self._phase_name == "forward":
            self._gpu_token = self._timer.begin(self.step_id)  # CUDA events: asynchronous, no sync
        self._phase_start = monotonic_ns()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.phases.append((self._phase_name, self._phase_start, monotonic_ns()))
        if self._gpu_token is not None:
            self._timer.end(self._gpu_token)
            self._gpu_token = None

    def mark(self, name: str | None) -> None:
        """A phase boundary: the phase *name* starts now, and the phase marked before it in
        this step (if any) ends now; ``mark(None)`` ends it without starting another, and
        :meth:`EngineTracer.end_step` ends one left open.

        The same phases as ``with step.phase(name):`` blocks, for the tightest engine loops:
        one plain call per phase instead of a ``with`` block's two calls into ``__enter__``
        and ``__exit__``: ~2.7k instead of ~4.5k instructions per phase (docs/performance.md).
        The phases are contiguous: work between two marks belongs to the earlier one.
        """
        now = monotonic_ns()
        if self._mark_name is not None:
            self.phases.append((self._mark_name, self._mark_ns, now))
            if self._gpu_token is not None:
                self._timer.end(self._gpu_token)
                self._gpu_token = None
        self._mark_name = name
        self._mark_ns = now
        if self._timer is not None and name == "forward":
            self._gpu_token = self._timer.begin(self.step_id)

    def add_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record a phase measured elsewhere (monotonic ns of this process)."""
        self.phases.append((name, start_ns, end_ns))

    def batch(self, request_ids: Iterable[str], *, prefill_tokens: int = 0, decode_tokens: int = 0,
              waiting: int | None = None, running: int | None = None,
              kv_cache_usage: float | None = None, preempted: int = 0, cached_tokens: int = 0,
              size: int | None = None) -> None:
        """The requests in this step's batch, and the batch's numbers (*cached_tokens*: prompt
        tokens of the requests admitted now that the prefix cache served; *size*: see
        :meth:`batch_handles`)."""
        self.batch_requests(request_ids, preempted)
        if size is not None:
            self.size = size
        self.counted = True
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens
        self.waiting, self.running = waiting, running
        self.kv_cache_usage = kv_cache_usage
        self.cached_tokens += cached_tokens

    def batch_requests(self, request_ids: Iterable[str], preempted: int = 0) -> None:
        """The requests in this step's batch without the batch's numbers: enough for every request's
        own timeline (when it was first scheduled, which steps it was in), which is all a step of an
        unsampled window (``sampled`` False) is used for."""
        # RequestHandle.scheduled() inlined: this loop runs for every request in every step,
        # so the lookups run in C (map) and the loop body is one flag test and one append.
        if request_ids.__class__ is not list and request_ids.__class__ is not tuple:
            request_ids = list(request_ids)  # a generator: read once, used twice on the slow path
        handles: list[Any] = list(map(self.engine.tracker._open.get, request_ids))
        if not all(handles):  # an id the tracker never saw (None): the slow path logs and skips it
            handles = self.engine.handles_for(request_ids)
        self.batch_handles(handles, preempted)

    def batch_handles(self, handles: list[RequestHandle], preempted: int = 0, size: int | None = None) -> None:
        """:meth:`batch_requests` for an integration that already holds the batch's open records
        (those of this engine's tracker), found as it read the batch. *size*: the requests in the
        batch, where some of them have no record here (an engine that leaves unsampled requests
        to the server that owns them); the batch-size metric and ``llm.batch.size`` count it."""
        if size is not None:
            self.size = size
        note_batch(handles, self.step_id, self.start_ns)
        if self.engine.energy_accounting:
            for handle in handles:
                if handle.finish_ns is None:
                    handle.step_records.append(self)
        self.handles += handles
        self.preempted += preempted

    def tokens(self, request_ids: Iterable[str] | None = None) -> None:
        """Each of these requests (default: the whole batch) produced one output token now."""
        now = monotonic_ns()
        handles = self.handles if request_ids is None else self.engine.handles_for(request_ids)
        for handle in handles:  # RequestHandle.token(1) inlined
            if handle.finish_ns is None:
                handle.token_ns.append(now)

    def set(self, key: str, value: Any) -> None:
        """Any further attribute for the ``llm.step`` span."""
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value


def note_batch(handles: list[RequestHandle], step_id: int, start_ns: int) -> None:
    """The requests' own timelines: these open records are in step *step_id*, which began at
    *start_ns* (their first scheduling, where they were waiting). What a step of an unsampled window
    reported with :meth:`EngineTracer.count_step` keeps of its batch."""
    for handle in handles:
        if handle.finish_ns is None:
            if handle.awaiting_schedule:
                handle.scheduled(at_ns=start_ns)
            handle.steps.append(step_id)


class _Window:
    __slots__ = ("busy_ns", "counted_sizes", "end_ns", "forward_seen", "gcs", "sampled", "start_ns", "steps",
                 "wall_offset_ns")

    def __init__(self, start_ns: int, sampled: bool) -> None:
        self.start_ns = self.end_ns = start_ns
        self.sampled = sampled
        # One offset for the window's spans (see lifecycle/clock.py): taken when it opens,
        # as a request takes one when it starts, so steps and requests of the same moment agree.
        self.wall_offset_ns = offset_ns()
        self.steps: list[StepRecord] = []
        self.gcs: list[tuple[int, int, int, int]] = []
        #: Steps counted without a record (:meth:`EngineTracer.count_step`): their batch sizes, and
        #: the forward time and end of them all.
        self.counted_sizes: list[int] = []
        self.busy_ns = 0
        self.forward_seen = False

    def __len__(self) -> int:
        return len(self.steps) + len(self.counted_sizes)

    def totals(self) -> WindowTotals:
        """What the window's metrics need, from its step records and its counted steps alike."""
        sizes = [step.batch_size for step in self.steps]
        sizes += self.counted_sizes
        busy, forward_seen = self.busy_ns, self.forward_seen
        for step in self.steps:
            for name, start, end in step.phases:
                if name == "forward":
                    busy += end - start
                    forward_seen = True
        start = min(self.start_ns, self.steps[0].start_ns) if self.steps else self.start_ns
        end = max(self.end_ns, self.steps[-1].end_ns) if self.steps else self.end_ns
        return WindowTotals(sizes, busy, end - start, forward_seen)


class WindowTotals(NamedTuple):
    """A closed window's steps in the terms of the serving metrics."""

    #: Requests in each step's batch.
    batch_sizes: list[int]
    #: Time in forward phases.
    busy_ns: int
    #: First step's start to last step's end.
    span_ns: int
    #: Whether any step timed its forward pass (else the idle ratio is unknown).
    forward_seen: bool


_ENGINES: weakref.WeakSet[EngineTracer] = weakref.WeakSet()
_gc_lock = threading.Lock()
_gc_installed = False
_gc_start_ns = 0


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    global _gc_start_ns
    if phase == "start":
        _gc_start_ns = monotonic_ns()
        return
    end = monotonic_ns()
    event = (_gc_start_ns, end, info.get("generation", -1), info.get("collected", 0))
    for engine in list(_ENGINES):
        window = engine._window
        if window is not None and window.sampled:
            window.gcs.append(event)


def _install_gc_callback() -> None:
    global _gc_installed
    with _gc_lock:
        if not _gc_installed:
            gc.callbacks.append(_gc_callback)
            _gc_installed = True


def uninstall_gc_callback() -> None:
    global _gc_installed
    with _gc_lock:
        if _gc_installed and _gc_callback in gc.callbacks:
            gc.callbacks.remove(_gc_callback)
        _gc_installed = False


class EngineTracer:
    """The timeline of one engine (one scheduler driving one device group)."""

    def __init__(self, engine_id: str = "engine0", tracker: RequestTracker | None = None) -> None:
        settings = _runtime.settings()
        self.engine_id = engine_id
        self.tracker = tracker if tracker is not None else RequestTracker()
        self._next_step = 0
        self._window: _Window | None = None
        self._window_ns = int(settings.engine_window_s * 1e9)
        self._window_steps = settings.engine_window_steps
        self._ratio = settings.engine_sample_ratio
        self._rng = random.Random()
        #: Keep step records on requests for per-request energy (only when a GPU reports energy).
        self.energy_accounting = energy_available()
        #: CUDA-event timing of forward phases, once torch has initialised CUDA (checked per window).
        self.forward_timer: Any = None
        #: The compiled counter of this engine's unsampled windows' steps (:meth:`attach_counter`).
        self.counter: Any = None
        _ENGINES.add(self)
        if settings.gc_spans:
            _install_gc_callback()

    def begin_step(self, start_ns: int | None = None) -> StepRecord:
        """A scheduler iteration starts now (or at *start_ns*, monotonic)."""
        now = monotonic_ns() if start_ns is None else start_ns
        window = self._window
        if window is None:
            window = self._open_window(now)
        step = StepRecord(self, self._next_step, now, window.sampled)
        self._next_step += 1
        return step

    def _open_window(self, now: int) -> _Window:
        window = self._window = _Window(now, self._rng.random() < self._ratio)
        if self.forward_timer is None:
            self.forward_timer = _forward_timer()
        return window

    def needs_step_record(self, now: int, records_open: bool = True) -> bool:
        """Whether a step beginning *now* needs a :class:`StepRecord` (:meth:`begin_step`): its window
        becomes spans, or requests keep their steps' records for per-request energy (*records_open*:
        whether any request of this engine has a record open). Otherwise an engine loop may report it
        with :meth:`count_step` alone, for a fraction of the cost: the steps of an unsampled window feed
        only the serving metrics (batch sizes, forward time) and the timelines of the requests in them,
        which the integration keeps with :func:`note_batch`. Opens the window."""
        window = self._window
        if window is None:
            window = self._open_window(now)
        return window.sampled or (records_open and self.energy_accounting)

    def next_step_id(self) -> int:
        """The id of a step reported with :meth:`count_step` (ids are shared with :meth:`begin_step`'s)."""
        step_id = self._next_step
        self._next_step = step_id + 1
        return step_id

    def count_step(self, start_ns: int, end_ns: int, batch_size: int, forward_ns: int | None = None) -> None:
        """A step without a record (see :meth:`needs_step_record`): its batch size for the batch-size
        histogram, its forward time (None: not timed) for the engine's idle ratio. Closes the window when
        it is full or old enough, as :meth:`end_step` does."""
        window = self._window
        if window is None:  # closed since the step began: count it in a fresh window
            window = self._open_window(start_ns)
        sizes = window.counted_sizes
        sizes.append(batch_size)
        if forward_ns is not None:
            window.busy_ns += forward_ns
            window.forward_seen = True
        window.end_ns = end_ns  # (steps end in order: one engine thread reports them)
        if len(sizes) + len(window.steps) >= self._window_steps or end_ns - window.start_ns >= self._window_ns:
            self.flush_window()

    def attach_counter(self, records: dict[Any, Any], batch_attr: str, busy_attr: str,
                       max_pending: int = 16) -> Any:
        """Have llmtrace's compiled core count the steps of this engine's unsampled windows, where it is
        built (``LLMTRACE_STEP_COUNTER=python``: never): the counter made (``llmtrace_native.StepCounter``),
        or None. An integration's step hooks hand it each step (``scheduled``, ``dispatched``,
        ``updated``) and do the step themselves, through this class, when it declines one: when
        *records* (the engine's open request records) is not empty, outside a window it was let into
        (:meth:`allow_counter`), and at a step where it answers that the window must be settled
        (:meth:`settle_counter`). *batch_attr*: the attribute of a step's key object whose length is
        the batch size; *busy_attr*: the engine's attribute that is empty when no request is left.
        Counted there, a step costs the engine thread three calls instead of ~170 bytecodes
        (docs/performance.md), for the same window totals."""
        native = _native.chosen_by("LLMTRACE_STEP_COUNTER")
        self.counter = None if native is None else native.StepCounter(records, batch_attr, busy_attr, max_pending)
        return self.counter

    def allow_counter(self, engine: Any, begun: int = 1) -> None:
        """The open window is unsampled: the counter may take the next steps of *engine*, up to the
        window's age and size (*begun*: steps begun that the window will count but does not hold yet)."""
        counter, window = self.counter, self._window
        if counter is not None and window is not None and not window.sampled:
            counter.allow(engine, window.start_ns + self._window_ns, self._window_steps - len(window) - begun)

    def settle_counter(self) -> None:
        """Take the steps the counter counted into the open window, and close the window when it is full
        or old enough, as :meth:`count_step` does."""
        window = self._take_counted()
        if window is not None and (len(window) >= self._window_steps
                                   or window.end_ns - window.start_ns >= self._window_ns):
            self.flush_window()

    def _take_counted(self) -> _Window | None:
        """The counter's steps since it was last asked, in the open window (opened for them if none is)."""
        counted = self.counter.drain() if self.counter is not None else None
        if counted is None:
            return None
        sizes, busy_ns, forward_seen, first_start_ns, end_ns = counted
        window = self._window
        if window is None:  # closed since they began: count them in a fresh window, as count_step does
            window = self._open_window(first_start_ns)
        window.counted_sizes += sizes
        window.busy_ns += busy_ns
        window.forward_seen = window.forward_seen or forward_seen
        window.end_ns = max(window.end_ns, end_ns)
        self._next_step += len(sizes)  # (their ids: one sequence with the others')
        return window

    def end_step(self, step: StepRecord) -> None:
        """The iteration is over; closes the window when it is full or old enough."""
        if step._mark_name is not None:
            step.mark(None)
        step.end_ns = end = monotonic_ns()
        window = self._window
        if window is None:  # end_step without begin_step: keep the step in a fresh window
            window = self._window = _Window(step.start_ns, self._rng.random() < self._ratio)
        steps = window.steps
        steps.append(step)
        if len(steps) + len(window.counted_sizes) >= self._window_steps or end - window.start_ns >= self._window_ns:
            self.flush_window()

    def handles_for(self, request_ids: Iterable[str]) -> list[RequestHandle]:
        """The open records of *request_ids*, in order; an id the tracker never saw is logged
        once and skipped. The lookups run in C (``map``)."""
        if request_ids.__class__ is not list and request_ids.__class__ is not tuple:
            request_ids = list(request_ids)  # a generator: read once, used twice on the slow path
        found = list(map(self.tracker._open.get, request_ids))
        if all(found):
            return found  # type: ignore[return-value]  # no None in it
        known = []
        for request_id, handle in zip(request_ids, found, strict=True):
            if handle is None:
                self.tracker.get(request_id)  # logs the unknown id once
            else:
                known.append(handle)
        return known

    def step(self) -> _StepScope:
        """``with engine.step() as step:`` — begin_step/end_step as a context manager."""
        return _StepScope(self)

    def idle(self) -> None:
        """Call when the engine has no work: closes an open window that has reached its age,
        so an idle engine's last steps are exported now rather than at its next step."""
        window = self._window
        if window is not None and monotonic_ns() - window.start_ns >= self._window_ns:
            self.flush_window()

    def flush_window(self) -> None:
        """Close the current window now (called on shutdown and when a window is full)."""
        if self.counter is not None:
            self.counter.stop()
            self._take_counted()
        window, self._window = self._window, None
        if window is None or not len(window):
            return
        BUILDER.submit(lambda: _build_window(self.engine_id, window, self.forward_timer))


def _forward_timer() -> Any:
    """A CUDA-event ForwardTimer when this process's torch has initialised CUDA, else None."""
    try:
        from llmtrace.gpu.cuda_timing import ForwardTimer, cuda_in_use
    except ImportError:
        return None
    return ForwardTimer() if cuda_in_use() else None


def _gpu_timing_attributes(timing: Any, offset: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.LLM_FORWARD_GPU_TIME_S: timing.gpu_time_s}
    if timing.gpu_start_mono_ns is not None and timing.gpu_end_mono_ns is not None:
        attrs[semconv.LLM_FORWARD_GPU_START_NS] = to_wall_ns(timing.gpu_start_mono_ns, offset)
        attrs[semconv.LLM_FORWARD_GPU_END_NS] = to_wall_ns(timing.gpu_end_mono_ns, offset)
    return attrs


class _StepScope:
    __slots__ = ("_engine", "_step")

    def __init__(self, engine: EngineTracer) -> None:
        self._engine = engine
        self._step: StepRecord | None = None

    def __enter__(self) -> StepRecord:
        self._step = self._engine.begin_step()
        return self._step

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._step is not None:
            self._engine.end_step(self._step)


def _step_attributes(engine_id: str, step: StepRecord) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        semconv.LLM_ENGINE_ID: engine_id,
        semconv.LLM_STEP_ID: step.step_id,
        semconv.LLM_BATCH_SIZE: step.batch_size,
        semconv.LLM_PREEMPTED: step.preempted,
        semconv.LLM_BATCH_REQUEST_IDS: [h.request_id for h in step.handles[:MAX_BATCH_IDS_ATTR]],
    }
    if step.counted or not step.handles:
        # Not counted: a step that began in an unsampled window and closed in a sampled one (the
        # window turned over between its schedule and its outputs); its split is unknown, not zero.
        attrs[semconv.LLM_BATCH_PREFILL_TOKENS] = step.prefill_tokens
        attrs[semconv.LLM_BATCH_DECODE_TOKENS] = step.decode_tokens
    for key, value in ((semconv.LLM_QUEUE_WAITING, step.waiting), (semconv.LLM_QUEUE_RUNNING, step.running),
                       (semconv.LLM_KV_CACHE_USAGE, step.kv_cache_usage)):
        if value is not None:
            attrs[key] = value
    if step.cached_tokens:
        attrs[semconv.LLM_BATCH_CACHED_TOKENS] = step.cached_tokens
    if step.attributes:
        attrs.update(step.attributes)
    return attrs


def _links(step: StepRecord, limit: int) -> list[Link]:
    """The step's links to its requests' spans: each request's one link object, made on its first step."""
    return [link for handle in step.handles[:limit] if (link := handle.step_link or _step_link(handle)) is not None]


def _step_link(handle: RequestHandle) -> Link | None:
    """A request's link from the steps it is in. Its only attribute is the request's id: the step's id
    is the step span's own attribute, so a link per request serves every step (None: no valid context)."""
    span = handle.span
    ctx = span.get_span_context() if span is not None else _parent_span_context(handle)
    if not ctx.is_valid:
        return None
    link = handle.step_link = Link(ctx, {semconv.LLM_REQUEST_ID: handle.request_id})
    return link


def _parent_span_context(handle: RequestHandle) -> trace.SpanContext:
    """A request whose span lives in another process: the carrier's context."""
    return trace.get_current_span(handle.context()).get_span_context()


@guarded("engine.window")
def _build_window(engine_id: str, window: _Window, forward_timer: Any = None) -> None:
    # The window closed a while after its forwards were launched: most CUDA events have
    # completed, and query() (never synchronize()) resolves them.
    gpu_timings = {t.key: t for t in forward_timer.resolve_ready()} if forward_timer is not None else {}

    metrics = _runtime.serving_metrics()
    if metrics is not None:
        metrics.record_window(engine_id, window.totals())
    if not window.sampled or not window.steps:
        return
    spans = emit.current()
    offset = window.wall_offset_ns
    start, end = window.steps[0].start_ns, window.steps[-1].end_ns
    root = spans.open(semconv.SPAN_ENGINE, None, to_wall_ns(start, offset),
                      {semconv.LLM_ENGINE_ID: engine_id, semconv.LLM_ENGINE_WINDOW_STEPS: len(window.steps)})
    if root is None:
        return
    root_ctx = root.get_span_context()
    if root_ctx is None:  # not a span this module can parent on (no tracer made one so far)
        return
    if isinstance(spans, emit.SdkFinishedSpans):
        _steps_finished(spans, engine_id, window, root_ctx, gpu_timings)
    else:
        _steps_opened(spans, engine_id, window, root_ctx, gpu_timings)
    for g_start, g_end, generation, collected in window.gcs:
        gc_span = spans.open(semconv.SPAN_GC, root_ctx, to_wall_ns(g_start, offset),
                             {semconv.LLM_GC_GENERATION: generation, semconv.LLM_GC_COLLECTED: collected,
                              semconv.LLM_ENGINE_ID: engine_id})
        if gc_span is not None:
            spans.close(gc_span, to_wall_ns(g_end, offset))
    spans.close(root, to_wall_ns(max(end, *(g[1] for g in window.gcs)) if window.gcs else end, offset))


def _phase_attributes(engine_id: str, step: StepRecord, span_name: str, p_start: int, p_end: int,
                      gpu_timings: dict[int, Any], offset: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.LLM_STEP_ID: step.step_id}
    if span_name == semconv.SPAN_FORWARD:
        attrs[semconv.LLM_ENGINE_ID] = engine_id
        attrs.update(span_attributes_for(p_start, p_end))
        if (timing := gpu_timings.get(step.step_id)) is not None:
            attrs.update(_gpu_timing_attributes(timing, offset))
    return attrs


def _full_step_attributes(engine_id: str, step: StepRecord) -> dict[str, Any]:
    attrs = _step_attributes(engine_id, step)
    attrs.update(span_attributes_for(step.start_ns, step.end_ns))
    return attrs


def _steps_finished(spans: emit.SdkFinishedSpans, engine_id: str, window: _Window, root_ctx: trace.SpanContext,
                    gpu_timings: dict[int, Any]) -> None:
    """The window's steps and phases with the SDK: each step's spans are built finished (every time
    is known by now) and reach the export processors in one call."""
    offset = window.wall_offset_ns
    max_links = _runtime.settings().max_links
    child, end_all = spans.child, spans.end_all
    pause = GilYield().maybe  # a window is tens of ms of work: let the engine thread in meanwhile
    for step in window.steps:
        pause()
        span = child(semconv.SPAN_STEP, root_ctx, to_wall_ns(step.start_ns, offset),
                     to_wall_ns(step.end_ns, offset), _full_step_attributes(engine_id, step), _links(step, max_links))
        if span is None:
            continue
        done = []
        step_ctx = span.context
        for name, p_start, p_end in step.phases:
            span_name = PHASE_NAMES.get(name, name)
            phase = child(span_name, step_ctx, to_wall_ns(p_start, offset), to_wall_ns(p_end, offset),
                          _phase_attributes(engine_id, step, span_name, p_start, p_end, gpu_timings, offset))
            if phase is not None:
                done.append(phase)
        done.append(span)  # the order spans that end one by one arrive in: children first
        end_all(done)


def _steps_opened(spans: emit.FinishedSpans, engine_id: str, window: _Window, root_ctx: trace.SpanContext,
                  gpu_timings: dict[int, Any]) -> None:
    """The window's steps and phases through any tracer: opened and closed one by one."""
    offset = window.wall_offset_ns
    max_links = _runtime.settings().max_links
    pause = GilYield().maybe
    for step in window.steps:
        pause()
        span = spans.open(semconv.SPAN_STEP, root_ctx, to_wall_ns(step.start_ns, offset),
                          _full_step_attributes(engine_id, step), _links(step, max_links))
        if span is None:
            continue
        step_ctx = span.get_span_context()
        for name, p_start, p_end in step.phases:
            span_name = PHASE_NAMES.get(name, name)
            phase_attrs = _phase_attributes(engine_id, step, span_name, p_start, p_end, gpu_timings, offset)
            if (phase := spans.open(span_name, step_ctx, to_wall_ns(p_start, offset), phase_attrs)) is not None:
                spans.close(phase, to_wall_ns(p_end, offset))
        spans.close(span, to_wall_ns(step.end_ns, offset))
