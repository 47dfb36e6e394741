"""The analyzer's one compiled boundary: the kernels it runs, compiled or in Python.

Every operation that has a compiled implementation in ``native/`` (the ``llmtrace_native``
module) is reached through :data:`KERNELS`, chosen once here; no analyzer asks whether the
compiled module is there. The two implementations of :class:`Kernels`:

* :class:`NativeKernels` — the compiled module (``.ci/run`` builds it wherever ``cargo``
  is; the production path). It carries the speed budget (docs/analysis.md, "Performance").
* :class:`~llmtrace.analysis._oracle.PythonKernels` — plain Python, written to be read:
  the reference the compiled kernels are tested against, and what runs without a build,
  with a build from another llmtrace version, or with ``LLMTRACE_ANALYSIS_NATIVE=0``
  (:mod:`llmtrace.analysis._native` decides which).

The engine table's answers about one engine's steps are part of the boundary too:
:meth:`Kernels.engine` gives an :class:`EngineSteps`, from the table's columns
(:class:`NativeEngine`) when it holds the engine, else from its ``StepView`` objects
(:class:`~llmtrace.analysis._steps.PythonEngine`).

The compiled kernels take 64-bit times; the rare input beyond them (a corrupt file's
astronomically large time, which the generic decoder accepts) is handed to the Python
kernels here, so callers never see the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from llmtrace import semconv as sc
from llmtrace.analysis import _native, _oracle, _steps
from llmtrace.analysis._steps import GapInputs, GapTotals, IdleGaps, StepStats, WindowIdle
from llmtrace.analysis.engine_table import CompiledEngine, CompiledRows, EngineTable
from llmtrace.analysis.intervals import Interval, merge
from llmtrace.analysis.model import (
    EMPTY_ATTRS,
    GAP_CAUSES,
    HOST_CAUSE_INDEX,
    EngineView,
    Gap,
    Link,
    PathItem,
    PathSums,
    Section,
    Span,
    SpanKind,
    StatusCode,
)

if TYPE_CHECKING:
    import llmtrace_native  # the stub, native/llmtrace_native.pyi

Children = _oracle.Children

#: The spans the compiled decoder keeps as columns in an engine table; its name code for a
#: span is the index here (``gpu_idle`` reads host causes by it).
ENGINE_SPANS = [sc.SPAN_ENGINE, sc.SPAN_STEP, sc.SPAN_SCHEDULE, sc.SPAN_FORWARD, sc.SPAN_SAMPLE,
                sc.SPAN_POSTPROCESS, sc.SPAN_GC]
#: The step attributes the engine table reads, in the order it expects them.
STEP_KEYS = [sc.LLM_ENGINE_ID, sc.LLM_STEP_ID, sc.LLM_BATCH_SIZE, sc.LLM_QUEUE_WAITING, sc.LLM_QUEUE_RUNNING,
             sc.LLM_KV_CACHE_USAGE, sc.LLM_PREEMPTED, sc.LLM_BATCH_REQUEST_IDS]
#: Cause index (into GAP_CAUSES) by the engine table's host-span name code - 2 (schedule,
#: forward, sample, postprocess in :data:`ENGINE_SPANS`); forward is never a host span.
_TABLE_HOST_CAUSES = (
    HOST_CAUSE_INDEX[sc.SPAN_SCHEDULE],
    0,
    HOST_CAUSE_INDEX[sc.SPAN_SAMPLE],
    HOST_CAUSE_INDEX[sc.SPAN_POSTPROCESS],
)


class EngineSteps(Protocol):
    """What the analyzers ask about one engine's steps (:meth:`Kernels.engine`): the compiled
    engine table answers for an engine it holds, :class:`~llmtrace.analysis._steps.PythonEngine`
    (the reference) for any other. Intervals are ``(start_ns, end_ns)``."""

    def segments(self) -> list[Interval]:
        """The analysed time of an engine without windows: runs of consecutive step ids, merged."""
        ...

    def step_runs(self) -> list[Interval]:
        """When the step attributes say work was waiting (:func:`~llmtrace.analysis._steps.step_runs`)."""
        ...

    def step_starts(self) -> list[int]:
        """Every step's start, in step order."""
        ...

    def step_stats(self, lo: int, hi: int) -> StepStats:
        """:func:`~llmtrace.analysis._steps.step_stats` of steps ``lo..hi``."""
        ...

    def gaps(self, sweep: GapInputs) -> list[Gap]:
        """The classified idle gaps inside ``sweep.segs``, sorted (:meth:`Kernels.classify_gaps`
        over the steps' forwards and host spans)."""
        ...

    def idle(self, sweep: GapInputs, engine_work: Sequence[Interval], windows: Sequence[Interval]) -> IdleGaps:
        """:meth:`gaps` and their :func:`~llmtrace.analysis._steps.gap_totals`."""
        ...


class Kernels(Protocol):
    """What the analyzers run through :data:`KERNELS` (both implementations give the same
    results; the differential tests in tests/analysis/ check it)."""

    #: Whether these are the compiled kernels (reported by ``LLMTRACE_ANALYSIS_DECODER``
    #: errors and the benchmarks).
    compiled: bool

    def decode_line(self, data: bytes, strings: dict[str, str], table: EngineTable | None) -> list[Span] | None:
        """The spans of one OTLP/JSON traces line (strings interned through ``strings``), or
        ``None`` when the generic reader (``sources/otlp.py``) must read it. With ``table``,
        engine-side spans go into it instead of the list."""
        ...

    def new_engine_table(self) -> EngineTable | None:
        """An empty engine table for ``load_spans(table=...)``, or ``None`` (no table)."""
        ...

    def chrome_trace_events(self) -> type[llmtrace_native.ChromeTraceEvents] | None:
        """The compiled Chrome trace writer's class (``analysis/_perfetto_native.py`` drives
        it), or ``None``: the Python writer (``analysis/perfetto.py``) writes exports."""
        ...

    def critical_path(self, children: Children, root: Span, overlap_allowance_ns: int) -> list[Section]:
        """:func:`llmtrace.analysis.critical_path.critical_path` over ``Trace.children``."""
        ...

    def path_totals(self, items: Sequence[PathItem], overlap_allowance_ns: int) -> PathSums:
        """Every request's critical path, summed (:class:`~llmtrace.analysis.model.PathSums`)."""
        ...

    def classify_gaps(
        self,
        engine_id: str,
        segs: Sequence[Interval],
        forwards: Sequence[Span],
        hosts: Sequence[Span],
        extras: Sequence[tuple[int, int, int]],
        work: Sequence[Interval],
    ) -> list[Gap]:
        """An engine's classified idle gaps (:func:`llmtrace.analysis._oracle.classify_gaps`)."""
        ...

    def engine(self, view: EngineView) -> EngineSteps:
        """What the analyzers ask about ``view``'s steps: from the compiled engine table
        when it holds the engine (and these are the compiled kernels), else from its
        ``StepView`` objects."""
        ...

    def step_stats(self, views: Sequence[EngineView]) -> StepStats:
        """:func:`~llmtrace.analysis._steps.step_stats` of every engine's steps, one engine
        after another."""
        ...


class NativeKernels:
    """The compiled kernels, adapted to :class:`Kernels` (arguments as the module takes
    them: lists, dicts, the result types)."""

    compiled = True

    def __init__(self) -> None:
        import llmtrace_native  # typed by native/llmtrace_native.pyi

        # Bound one by one (not the module object, which mypy types as a plain ModuleType)
        # so that every call below is checked against the stub.
        self._new_table = llmtrace_native.EngineTable
        self._critical_path = llmtrace_native.critical_path
        self._path_totals = llmtrace_native.path_totals
        self._classify_gaps = llmtrace_native.classify_gaps
        #: The compiled OTLP line decoder (tests read lines with it directly).
        self.decoder = llmtrace_native.Decoder(
            Span,
            Link,
            [SpanKind(i) for i in range(6)],
            [StatusCode(i) for i in range(3)],
            EMPTY_ATTRS,
            ENGINE_SPANS,
            sc.SERVICE_NAME,
            STEP_KEYS,
        )
        # A build that predates the compiled Chrome trace writer lacks it (the rest of the
        # module is the same ABI): then exports take the Python writer.
        self._chrome: type[llmtrace_native.ChromeTraceEvents] | None = getattr(
            llmtrace_native, "ChromeTraceEvents", None
        )
        self._python = _oracle.PythonKernels()

    def decode_line(self, data: bytes, strings: dict[str, str], table: EngineTable | None) -> list[Span] | None:
        if table is None:
            return self.decoder.spans_from_line(data, strings)
        return self.decoder.spans_from_line(data, strings, table.native)

    def new_engine_table(self) -> EngineTable | None:
        return EngineTable(self._new_table(self.decoder))

    def chrome_trace_events(self) -> type[llmtrace_native.ChromeTraceEvents] | None:
        return self._chrome

    def critical_path(self, children: Children, root: Span, overlap_allowance_ns: int) -> list[Section]:
        try:
            return self._critical_path(_as_dict(children), root, overlap_allowance_ns, Section)
        except OverflowError:  # a time beyond int64
            return self._python.critical_path(children, root, overlap_allowance_ns)

    def path_totals(self, items: Sequence[PathItem], overlap_allowance_ns: int) -> PathSums:
        compiled_items = [(_as_dict(children), root, ttft, sid) for children, root, ttft, sid in items]
        try:
            return PathSums(*self._path_totals(compiled_items, overlap_allowance_ns))
        except OverflowError:  # a time beyond int64
            return self._python.path_totals(items, overlap_allowance_ns)

    def classify_gaps(
        self,
        engine_id: str,
        segs: Sequence[Interval],
        forwards: Sequence[Span],
        hosts: Sequence[Span],
        extras: Sequence[tuple[int, int, int]],
        work: Sequence[Interval],
    ) -> list[Gap]:
        try:
            return self._classify_gaps(
                engine_id, list(segs), list(forwards), list(hosts), HOST_CAUSE_INDEX, list(extras),
                list(work), Gap, GAP_CAUSES,
            )
        except OverflowError:  # a time beyond int64
            return self._python.classify_gaps(engine_id, segs, forwards, hosts, extras, work)

    def engine(self, view: EngineView) -> EngineSteps:
        handle: CompiledEngine | None = view.compiled
        if handle is None:
            return _steps.PythonEngine(view, self.classify_gaps)
        return NativeEngine(view, handle)

    def step_stats(self, views: Sequence[EngineView]) -> StepStats:
        handles = [v.compiled for v in views]
        first = handles[0] if handles else None
        if first is not None and all(h is not None and h.table is first.table for h in handles):
            return StepStats(*first.table.step_stats([h.engine for h in handles]))
        return self._python.step_stats(views)


class NativeEngine:
    """An engine the compiled engine table holds, adapted to :class:`EngineSteps`. A time
    beyond int64 (a request's, handed in) is answered by the Python reference over the
    engine's steps."""

    def __init__(self, view: EngineView, handle: CompiledEngine) -> None:
        self._view = view
        self._table, self._index = handle

    def segments(self) -> list[Interval]:
        return merge(self._table.step_segments(self._index))

    def step_runs(self) -> list[Interval]:
        return self._table.step_runs(self._index)

    def step_starts(self) -> list[int]:
        return self._table.step_starts(self._index)

    def step_stats(self, lo: int, hi: int) -> StepStats:
        return StepStats(*self._table.step_stats([self._index], lo, hi))

    def gaps(self, sweep: GapInputs) -> list[Gap]:
        segs, work, extras = sweep
        try:
            gap_set = self._table.idle(self._index, segs, _TABLE_HOST_CAUSES, extras, work, [], [], GAP_CAUSES)[0]
        except OverflowError:
            return self._python().gaps(sweep)
        return gap_set.rows(0, len(gap_set), self._view.engine_id, Gap, GAP_CAUSES)

    def idle(self, sweep: GapInputs, engine_work: Sequence[Interval], windows: Sequence[Interval]) -> IdleGaps:
        """The gaps stay in Rust (a ``GapSet`` this result alone holds), made into
        :class:`Gap` tuples when read (the reports read a few dozen)."""
        segs, work, extras = sweep
        try:
            gap_set, per_cause, with_work, side, idle, p50, p99, top, worst, per_window = self._table.idle(
                self._index, segs, _TABLE_HOST_CAUSES, extras, work, engine_work, windows, GAP_CAUSES
            )
        except OverflowError:
            return self._python().idle(sweep, engine_work, windows)
        engine_id = self._view.engine_id

        def fetch(lo: int, hi: int) -> tuple[Gap, ...]:
            return tuple(gap_set.rows(lo, hi, engine_id, Gap, GAP_CAUSES))

        found: CompiledRows[Gap] = CompiledRows(fetch, len(gap_set))
        totals = GapTotals(
            dict(zip(GAP_CAUSES, per_cause, strict=True)),
            with_work,
            side,
            idle,
            p50,
            p99,
            tuple(found[k] for k in top),
            found[worst] if worst >= 0 else None,
            tuple(WindowIdle(i, w, {GAP_CAUSES[c]: ns for c, ns in causes}) for i, w, causes in per_window),
        )
        return IdleGaps(found, totals)

    def _python(self) -> EngineSteps:
        return _steps.PythonEngine(self._view, _oracle.classify_gaps)


def _as_dict(children: Children) -> dict[str, Sequence[Span]]:
    """The compiled walk reads a ``dict`` (``Trace.build`` makes one; a hand-made trace
    may hold another mapping)."""
    return children if isinstance(children, dict) else dict(children)


def _choose() -> Kernels:
    return NativeKernels() if _native.native is not None else _oracle.PythonKernels()


#: The kernels every analyzer runs.
KERNELS: Kernels = _choose()

#: The Python kernels, always (the reference; tests compare :data:`KERNELS` against it).
PYTHON: Kernels = _oracle.PythonKernels()

__all__ = ["ENGINE_SPANS", "KERNELS", "PYTHON", "STEP_KEYS", "EngineSteps", "Kernels", "NativeEngine", "NativeKernels"]
