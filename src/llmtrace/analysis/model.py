"""The normalised trace model every analyzer works on.

Sources (OTLP JSON, Jaeger v3, legacy Jaeger JSON) all produce :class:`Span` objects with
integer-nanosecond times and hex ids; nothing downstream knows which format a span came
from. Spans are named tuples so a million of them fit in well under a gigabyte: ids and
names are interned (a trace id is shared by every span of the trace), and resource
attributes are one shared mapping per exporting process, not a copy per span.

Views join the two halves of the span model (docs/span-model.md):

* :class:`RequestView` — one ``llm.request`` with its phase children and its HTTP parent.
* :class:`StepView` / :class:`EngineView` — the scheduler timeline of one ``llm.engine.id``.

The join key between a request and the steps that served it is ``llm.step.id`` (the request
carries ``llm.step.first_id``/``last_id``; each step carries its id) — it survives link
capping. Span links from ``llm.step`` to ``llm.request`` are used where present.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from llmtrace import semconv as sc

AttrValue = Any
_F = TypeVar("_F")
Attributes = Mapping[str, AttrValue]
EMPTY_ATTRS: Attributes = MappingProxyType({})

#: Numeric attributes beyond this are not measurements (NaN and infinities fail both
#: comparisons; a huge integer would overflow float()): they read as absent.
FINITE_LIMIT = 1e300


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a real, finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not -FINITE_LIMIT < value < FINITE_LIMIT:
        return None
    return float(value)


#: The largest offset :func:`seconds_to_ns` returns: ~127 years, far beyond any span, and
#: still inside int64 when added to a current Unix time in nanoseconds.
MAX_OFFSET_NS = 4 * 10**18


def clamped_ns(seconds: float) -> float:
    """A duration attribute in nanoseconds, clamped to ±:data:`MAX_OFFSET_NS`: a finite but
    absurd value (``9e299`` s passes :func:`finite_number`) would otherwise overflow to
    infinity, which no integer can hold."""
    return max(-MAX_OFFSET_NS, min(seconds * 1e9, MAX_OFFSET_NS))


def seconds_to_ns(seconds: float) -> int:
    """:func:`clamped_ns`, rounded to whole nanoseconds."""
    return round(clamped_ns(seconds))


class SpanKind(IntEnum):
    """OTLP span kinds (the integer values of the OTLP proto enum)."""

    UNSPECIFIED = 0
    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(IntEnum):
    """OTLP status codes."""

    UNSET = 0
    OK = 1
    ERROR = 2


class Link(NamedTuple):
    """A span link (OTLP link, or a Jaeger ``FOLLOWS_FROM`` reference).

    A named tuple rather than a dataclass: a step links every request in its batch, so
    links are the most numerous objects after spans and tuple construction is 2x cheaper.
    """

    trace_id: str
    span_id: str


class Span(NamedTuple):
    """One span, normalised. Times are Unix-epoch nanoseconds; ids are lowercase hex.

    A named tuple, like :class:`Link`: a million are built per analysis, and the decoder
    makes them in C (``tuple.__new__`` over zipped columns) at half the cost of a slots
    class's ``__init__``. A field read costs a little more than a slots read, but measured
    end to end the tuple wins (docs/analysis.md, "Performance"). Spans without attributes
    share :data:`EMPTY_ATTRS`.
    """

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    kind: SpanKind = SpanKind.INTERNAL
    status: StatusCode = StatusCode.UNSET
    attributes: Attributes = EMPTY_ATTRS
    links: tuple[Link, ...] = ()
    service: str = ""
    resource: Attributes = EMPTY_ATTRS

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def attr(self, key: str, default: AttrValue = None) -> AttrValue:
        return self.attributes.get(key, default)


# A frozen dataclass's __init__ goes through object.__setattr__ per field: 3.4 µs for a
# Trace, more than the analyzer's per-span budget (docs/analysis.md, "Performance"). The hot
# paths build objects through a mutable twin with the identical slot layout and then retag
# them as the frozen class — from then on they are ordinary frozen instances.
def builder_class(cls: type[Any]) -> Any:
    """The mutable twin of the frozen slots dataclass ``cls``: same slots, plain ``__init__``.
    ``obj = twin(*fields); obj.__class__ = cls`` makes a frozen ``cls`` instance."""
    return dataclass(slots=True)(type(f"_{cls.__name__}Builder", (), {"__annotations__": dict(cls.__annotations__)}))


def fast_constructor(cls: type[_F]) -> Callable[..., _F]:
    """A positional constructor for the frozen slots dataclass ``cls`` that skips the
    frozen ``__setattr__`` (all fields must be passed, in declaration order)."""
    twin = builder_class(cls)

    def make(*args: Any) -> _F:
        obj = twin(*args)
        obj.__class__ = cls
        out: _F = obj
        return out

    return make


_START = attrgetter("start_ns")


@dataclass(frozen=True, slots=True)
class Trace:
    """All spans sharing one trace id, with the parent/child index built once."""

    trace_id: str
    spans: tuple[Span, ...]
    by_id: Mapping[str, Span]
    children: Mapping[str, tuple[Span, ...]]
    roots: tuple[Span, ...]

    @classmethod
    def build(cls, trace_id: str, spans: Iterable[Span], by_id: dict[str, Span] | None = None) -> Trace:
        """Index ``spans``; a span whose parent is absent (an orphan) becomes a root.

        ``by_id``, when given, must map every span id of ``spans`` to its span (the
        grouping pass has built it already)."""
        ordered = tuple(sorted(spans, key=_START))
        if by_id is None:
            by_id = {s.span_id: s for s in ordered}
        kids: dict[str, list[Span]] = {}
        roots = []
        for s in ordered:
            p = s.parent_id
            if p is not None and p in by_id and p != s.span_id:
                lst = kids.get(p)
                if lst is None:
                    kids[p] = [s]
                else:
                    lst.append(s)
            else:
                roots.append(s)
        children = {k: tuple(v) for k, v in kids.items()}
        return _new_trace(trace_id, ordered, by_id, children, tuple(roots))

    def children_of(self, span: Span) -> tuple[Span, ...]:
        return self.children.get(span.span_id, ())

    @property
    def orphans(self) -> tuple[Span, ...]:
        """Roots that name a parent the trace does not contain (a missing parent)."""
        return tuple(s for s in self.roots if s.parent_id is not None)


_new_trace: Callable[..., Trace] = fast_constructor(Trace)


#: Default of :class:`RequestView`'s decoded fields: decode them from the spans.
_DECODE: Any = type("_Decode", (), {"__repr__": lambda self: "<decode>"})()


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request: its ``llm.request`` span, HTTP parent (when present) and phases.

    The per-request metrics every analyzer reads (several times each) are decoded once, by
    :meth:`of` (``RequestView(trace, request, server, phases)`` decodes them too)."""

    trace: Trace
    request: Span
    server: Span | None
    phases: Mapping[str, tuple[Span, ...]]
    #: Client-visible latency: the HTTP span when traced, else ``gen_ai.latency.e2e``,
    #: else the ``llm.request`` span.
    e2e_s: float = _DECODE
    #: ``gen_ai.latency.time_to_first_token``, else the end of the last ``llm.prefill``.
    ttft_s: float | None = _DECODE
    input_tokens: int | None = _DECODE
    output_tokens: int | None = _DECODE

    def __post_init__(self) -> None:
        # Made with the four views only (:meth:`of`'s fast constructor skips this): decode.
        if _DECODE in (self.e2e_s, self.ttft_s, self.input_tokens, self.output_tokens):
            decoded = RequestView.of(self.trace, self.request, self.server, self.phases)
            for name in ("e2e_s", "ttft_s", "input_tokens", "output_tokens"):
                if getattr(self, name) is _DECODE:
                    object.__setattr__(self, name, getattr(decoded, name))

    @classmethod
    def of(
        cls, trace: Trace, request: Span, server: Span | None, phases: Mapping[str, tuple[Span, ...]]
    ) -> RequestView:
        attrs = request.attributes
        if server is not None:
            e2e = server.duration_ns / 1e9
        else:
            e2e_attr = _num_of(attrs, sc.GEN_AI_LATENCY_E2E)
            e2e = e2e_attr if e2e_attr is not None else request.duration_ns / 1e9
        ttft = _num_of(attrs, sc.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)
        if ttft is None:
            prefill = phases.get(sc.SPAN_PREFILL)
            if prefill:
                ttft = (max(p.end_ns for p in prefill) - request.start_ns) / 1e9
        n_in = _num_of(attrs, sc.GEN_AI_USAGE_INPUT_TOKENS)
        if n_in is None:  # vLLM's own tracing uses the older GenAI names
            n_in = _num_of(attrs, sc.VLLM_USAGE_PROMPT_TOKENS)
        n_out = _num_of(attrs, sc.GEN_AI_USAGE_OUTPUT_TOKENS)
        if n_out is None:
            n_out = _num_of(attrs, sc.VLLM_USAGE_COMPLETION_TOKENS)
        return _new_request(
            trace,
            request,
            server,
            phases,
            e2e,
            ttft,
            None if n_in is None else int(n_in),
            None if n_out is None else int(n_out),
        )

    @property
    def root(self) -> Span:
        """The span whose duration is the request latency seen by the client."""
        return self.server if self.server is not None else self.request

    def num(self, key: str) -> float | None:
        return _num_of(self.request.attributes, key)

    @property
    def request_id(self) -> str:
        rid = self.request.attributes.get(sc.LLM_REQUEST_ID)
        if rid is None:
            rid = self.request.attributes.get(sc.VLLM_REQUEST_ID)
        return str(rid) if rid is not None else self.request.span_id

    def phase_s(self, name: str) -> float:
        """Total seconds in the phase ``name`` (summed: ``llm.queue`` recurs after preemption)."""
        return sum([s.end_ns - s.start_ns for s in self.phases.get(name, ())]) / 1e9


def _num_of(attributes: Mapping[str, Any], key: str) -> float | None:
    """A request attribute as a finite float (``None``: absent or not a finite number)."""
    value = attributes.get(key)
    if value is None:
        return None
    # finite_number's answer, inlined for the plain int/float every parsed span carries.
    if (value.__class__ is float or value.__class__ is int) and -FINITE_LIMIT < value < FINITE_LIMIT:
        return float(value)
    return finite_number(value)


_new_request: Callable[..., RequestView] = fast_constructor(RequestView)


@dataclass(frozen=True, slots=True)
class StepView:
    """One scheduler iteration of one engine."""

    step: Span
    engine_id: str
    step_id: int | None
    forwards: tuple[Span, ...]
    host: tuple[Span, ...]  # llm.schedule / llm.sample / llm.postprocess children
    # The step attributes every analyzer reads, decoded once (0 when absent; kv -1 when absent).
    batch_size: float = 0.0
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = -1.0
    preempted: float = 0.0

    def num(self, key: str, default: float = 0.0) -> float:
        value = finite_number(self.step.attributes.get(key))
        return default if value is None else value


@dataclass(frozen=True, slots=True)
class WindowView:
    """One sampled ``llm.engine`` window (or, without windows, a run of consecutive steps)."""

    engine_id: str
    start_ns: int
    end_ns: int
    first_step_id: int | None
    last_step_id: int | None
    span_id: str | None


@dataclass(frozen=True, slots=True)
class EngineView:
    """The sampled timeline of one engine: windows, steps (sorted by start), gc pauses.

    ``compiled`` is set when the steps live in the compiled engine table
    (:mod:`llmtrace.analysis.engine_table`): ``steps`` then makes :class:`StepView` objects
    only when read. Only :mod:`llmtrace.analysis._kernels` reads the handle: the analyzers
    ask ``KERNELS.engine(view)``, which answers from the table or from ``steps``.
    """

    engine_id: str
    windows: tuple[WindowView, ...]
    steps: Sequence[StepView]
    gc: tuple[Span, ...]
    compiled: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TraceSet:
    """Everything one analysis run looks at, plus the joins between requests and steps."""

    traces: Sequence[Trace]  # with a compiled engine table: engine traces made on first use
    requests: tuple[RequestView, ...]
    engines: Mapping[str, EngineView]
    tokenize: tuple[Span, ...]
    warnings: tuple[str, ...] = ()

    @property
    def span_count(self) -> int:
        # engine_table.CompiledTraces counts its compiled traces without making them.
        python = getattr(self.traces, "python_part", self.traces)
        return sum(len(t.spans) for t in python) + getattr(self.traces, "compiled_spans", 0)

    def steps_of(self, request: RequestView) -> Iterator[StepView]:
        """Steps that served ``request``: by link, else by the ``llm.step.*_id`` range."""
        first = request.num(sc.LLM_STEP_FIRST_ID)
        last = request.num(sc.LLM_STEP_LAST_ID)
        rid = request.request.span_id
        for engine in self.engines.values():
            for st in engine.steps:
                in_range = first is not None and last is not None and st.step_id is not None
                if any(link.span_id == rid for link in st.step.links) or (
                    in_range and first <= st.step_id <= last  # type: ignore[operator]
                ):
                    yield st


# The results the analyzer's kernels (:mod:`llmtrace.analysis._kernels`) return. Named
# tuples, not dataclasses: there are several per request and one per step, and the
# compiled kernels allocate them directly.


class Section(NamedTuple):
    """``span`` owns the critical path in ``[start_ns, end_ns)``; ``stack`` is the name path."""

    span: Span
    start_ns: int
    end_ns: int
    stack: tuple[str, ...]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


#: What a GPU idle gap is attributed to, in priority order (docs/analysis.md): where host
#: activities overlap, the one earliest here wins; ``other`` is what none of them explains.
GAP_CAUSES = ("gc", "schedule", "postprocess", "sample", "tokenize", "other")
#: The cause index of each host span a step has (the others are ``gc``, from ``llm.gc``
#: spans, and ``tokenize``, from the front end's ``llm.tokenize`` spans).
HOST_CAUSE_INDEX = {
    sc.SPAN_SCHEDULE: GAP_CAUSES.index("schedule"),
    sc.SPAN_POSTPROCESS: GAP_CAUSES.index("postprocess"),
    sc.SPAN_SAMPLE: GAP_CAUSES.index("sample"),
}


class Gap(NamedTuple):
    """One idle interval of one engine, with its cause split and work-waiting time."""

    engine_id: str
    start_ns: int
    end_ns: int
    causes: tuple[tuple[str, int], ...]  # (cause, ns), only non-zero causes, in GAP_CAUSES order
    work_waiting_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def main_cause(self) -> str:
        return max(self.causes, key=lambda c: c[1])[0] if self.causes else "other"


#: (request span id, "e2e_s" | "ttft_s") -> (span name, seconds): the top critical-path
#: segment of that part of the request.
Dominant = dict[tuple[str, str], tuple[str, float]]

#: What one request's critical-path walk needs: its trace's children by parent id, the
#: root, the first token's time (``None``: unknown) and the request span id that keys its
#: dominant segments.
PathItem = tuple[Mapping[str, Sequence[Span]], Span, int | None, str]


class PathSums(NamedTuple):
    """Every request's critical path, summed: each name's exclusive ns per request it is on
    (first-seen order), the folded name stacks, the total latency, the dominant segments."""

    totals: dict[str, list[int]]
    folded: dict[tuple[str, ...], int]
    latency_ns: int
    dominant: Dominant
