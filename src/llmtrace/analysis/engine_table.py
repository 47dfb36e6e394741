"""Engine-side spans kept as columns by the compiled decoder, and the views built on them.

An inference server's traces are mostly its scheduler timeline — ``llm.engine`` windows,
an ``llm.step`` per iteration, four children per step (88% of the spans of the benchmark
set). Made into :class:`~llmtrace.analysis.model.Span` tuples with attribute dicts and
link tuples they alone cost more than the analysis budget (docs/perf-log.md). When a
read is given an :class:`EngineTable` and ``llmtrace-native`` is in use, the decoder keeps
spans with those names as columns in it instead (native/src/table/), losing nothing: any
of them can still become the same ``Span``.

:func:`build_compiled` then builds the trace set with those engines *compiled*: an
:class:`~llmtrace.analysis.model.EngineView` whose ``steps`` are made into Python objects
only when indexed or iterated, and whose ``compiled`` handle lets the kernels answer the
analyzers' questions about its steps from the table (``_kernels.KERNELS.engine``). It declines — and the
caller makes every span a Python object and takes the Python path — whenever the table's
traces are not exactly what the Python build would see: a trace that is partly Python
spans, a trace of several processes (clock-skew repair is Python's), an engine id of a
type the table does not format, an engine with steps on both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

from llmtrace.analysis.model import Span, StepView, Trace, WindowView, fast_constructor

if TYPE_CHECKING:
    import llmtrace_native  # the stub, native/llmtrace_native.pyi

_new_step = fast_constructor(StepView)
_CHUNK = 4096  # rows made into objects at a time while iterating
_T = TypeVar("_T")


class EngineTable:
    """Engine-side spans of one or more reads (see the module doc); built by
    :func:`llmtrace.analysis.sources.new_engine_table`, filled by ``load_spans(table=...)``."""

    def __init__(self, native_table: llmtrace_native.EngineTable) -> None:
        self.native = native_table

    def __len__(self) -> int:
        return len(self.native)

    @property
    def python_seen(self) -> int:
        """Python spans read so far: table spans are placed after this many."""
        return int(self.native.python_seen)

    @python_seen.setter
    def python_seen(self, n: int) -> None:
        self.native.python_seen = n

    def take_back(self, start: int) -> list[tuple[int, Span]]:
        """Spans from index ``start`` on as ``(python spans before it, Span)``, removed from
        the table (a filtered read takes its spans back)."""
        return [(int(b), s) for b, s in self.native.materialize(start, True)]

    def merged_with(self, spans: Sequence[Span]) -> list[Span]:
        """``spans`` with every table span put back in its place in the read order."""
        return merge_in(spans, ((int(b), s) for b, s in self.native.materialize(0, False)))


def merge_in(spans: Sequence[Span], placed: Iterable[tuple[int, Span]]) -> list[Span]:
    """``spans`` with each ``(before, span)`` inserted after the first ``before`` of them
    (``placed`` in read order, so ``before`` never decreases)."""
    out: list[Span] = []
    done = 0
    for before, span in placed:
        if before > done:
            out += spans[done:before]
            done = before
        out.append(span)
    out += spans[done:]
    return out


class CompiledEngine(NamedTuple):
    """What an analyzer needs to ask the table about one engine."""

    table: llmtrace_native.EngineTable
    engine: int  # the engine's index in the table


class CompiledRows(Sequence[_T]):
    """Rows the engine table holds, made into Python objects only when read: ``fetch(lo,
    hi)`` makes rows ``lo..hi`` (an engine's steps, its idle gaps)."""

    __slots__ = ("_fetch", "_len")

    def __init__(self, fetch: Callable[[int, int], tuple[_T, ...]], length: int) -> None:
        self._fetch = fetch
        self._len = length

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> _T: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[_T, ...]: ...
    def __getitem__(self, i: int | slice) -> _T | tuple[_T, ...]:
        if isinstance(i, slice):
            lo, hi, stride = i.indices(self._len)
            if stride == 1:
                return self._fetch(lo, hi)
            return tuple(self[k] for k in range(lo, hi, stride))
        k = i + self._len if i < 0 else i
        if not 0 <= k < self._len:
            raise IndexError("index out of range")
        return self._fetch(k, k + 1)[0]

    def __iter__(self) -> Iterator[_T]:
        for lo in range(0, self._len, _CHUNK):
            yield from self._fetch(lo, lo + _CHUNK)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CompiledRows({self._len} rows)"


def compiled_steps(engine: CompiledEngine, length: int) -> CompiledRows[StepView]:
    """An engine's steps as :class:`StepView` objects made on demand."""
    table, index = engine

    def fetch(lo: int, hi: int) -> tuple[StepView, ...]:
        return tuple(_new_step(*row) for row in table.steps(index, lo, hi))

    return CompiledRows(fetch, length)


class CompiledTraces(Sequence[Trace]):
    """The trace set's traces: those read as Python spans, then the table's, made into
    :class:`Trace` objects on first use."""

    __slots__ = ("_made", "_table", "compiled_spans", "compiled_traces", "python_part")

    def __init__(self, python: Sequence[Trace], table: llmtrace_native.EngineTable, traces: int, spans: int) -> None:
        self.python_part = python
        self.compiled_traces = traces
        self.compiled_spans = spans  # read by TraceSet.span_count
        self._table = table
        self._made: tuple[Trace, ...] | None = None

    def __len__(self) -> int:
        return len(self.python_part) + self.compiled_traces

    @overload
    def __getitem__(self, i: int) -> Trace: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Trace]: ...
    def __getitem__(self, i: int | slice) -> Trace | Sequence[Trace]:
        return self._all()[i]

    def __iter__(self) -> Iterator[Trace]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def _all(self) -> tuple[Trace, ...]:
        if self._made is None:
            table = tuple(Trace.build(tid, spans) for tid, spans in self._table.traces())
            self._made = (*self.python_part, *table)
        return self._made


class CompiledPart(NamedTuple):
    """What the table contributes to a trace set."""

    spans: int
    traces: int
    duplicates: int
    orphans: int
    engines: dict[str, tuple[tuple[WindowView, ...], CompiledRows[StepView], tuple[Span, ...], CompiledEngine]]


def build_part(table: EngineTable, python_trace_ids: Iterable[str]) -> CompiledPart | None:
    """Group the table into traces and engines, or ``None`` when Python must (module doc)."""
    native = table.native
    domain_ids: dict[tuple[Any, ...], int] = {}
    domains = [
        domain_ids.setdefault((service, res.get("host.name")), len(domain_ids))  # build._domain's clock
        for service, res in native.resources()
    ]
    built = native.build(set(python_trace_ids), domains)
    if built is None:
        return None
    spans, traces, dupes, orphans, engines = built
    out = {}
    for index, (eid, windows, gc, n) in enumerate(engines):
        handle = CompiledEngine(native, index)
        views = tuple(WindowView(eid, *w) for w in windows)
        out[eid] = (views, compiled_steps(handle, n), gc, handle)
    return CompiledPart(spans, traces, dupes, orphans, out)
