"""llmtrace's compiled core (native/src/lib.rs): the analyzer's kernels, reached only through
``llmtrace.analysis._kernels``, and the OTLP/JSON span encoder, through
``llmtrace._otel.otlp_json``. CI checks this stub against the built module
(``python -m mypy.stubtest llmtrace_native``)."""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar, final

__all__ = ["ABI_VERSION", "ChromeTraceEvents", "Decoder", "EngineTable", "GapSet", "OtlpJsonEncoder", "StepCounter", "TokenizerMethod", "asgi_send", "classify_gaps", "critical_path", "path_totals", "scans", "tokenizer_method", "tokenizer_passing_through"]

#: Bumped with ``llmtrace._native.ABI_VERSION`` whenever a signature changes.
ABI_VERSION: int

_Interval = tuple[int, int]
#: The named-tuple type a kernel is handed to build its results with (Gap, Section).
_T = TypeVar("_T", bound=tuple[Any, ...])
#: The span named tuple a decoder makes.
_S = TypeVar("_S", bound=tuple[Any, ...])

@final
class Decoder(Generic[_S]):
    """OTLP/JSON lines into ``Span`` tuples (``kinds[i]``: ``SpanKind(i)``, ``statuses[i]``:
    ``StatusCode(i)``; ``engine_spans``: the 7 names an engine table keeps, by name code;
    ``step_keys``: the 8 step attributes it reads)."""

    def __new__(
        cls,
        span_type: type[_S],
        link_type: type[tuple[Any, ...]],
        kinds: Sequence[Any],
        statuses: Sequence[Any],
        empty_attrs: Mapping[str, Any],
        engine_spans: Sequence[str],
        service_key: str,
        step_keys: Sequence[str],
    ) -> Decoder[_S]: ...
    def spans_from_line(
        self, data: bytes, strings: dict[str, str], table: EngineTable | None = None, scan: bool = True
    ) -> list[_S] | None: ...

@final
class GapSet:
    """One engine's classified idle gaps, made into ``gap_type`` tuples when read."""

    def __len__(self) -> int: ...
    def rows(self, lo: int, hi: int, engine_id: str, gap_type: type[_T], causes: tuple[str, ...]) -> list[_T]: ...

@final
class EngineTable:
    """Engine-side spans kept as columns (``llmtrace.analysis.engine_table``)."""

    python_seen: int
    def __new__(cls, decoder: Decoder[Any]) -> EngineTable: ...
    def __len__(self) -> int: ...
    def nbytes(self) -> int: ...
    def resources(self) -> list[tuple[str, Mapping[str, Any]]]: ...
    def materialize(self, start: int = 0, truncate: bool = False) -> list[tuple[int, Any]]: ...
    def build(
        self, python_traces: Any, domains: Sequence[int]
    ) -> (
        tuple[
            int,
            int,
            int,
            int,
            list[tuple[str, list[tuple[int, int, int | None, int | None, str]], tuple[Any, ...], int]],
        ]
        | None
    ): ...
    def traces(self) -> list[tuple[str, tuple[Any, ...]]]: ...
    def steps(self, e: int, lo: int, hi: int) -> list[tuple[Any, ...]]: ...
    def step_runs(self, e: int) -> list[_Interval]: ...
    def step_segments(self, e: int) -> list[_Interval]: ...
    def idle(
        self,
        e: int,
        segs: Sequence[_Interval],
        host_cause: Sequence[int],
        extras: Sequence[tuple[int, int, int]],
        work: Sequence[_Interval],
        engine_work: Sequence[_Interval],
        windows: Sequence[_Interval],
        causes: tuple[str, ...],
    ) -> tuple[
        GapSet, list[int], int, int, int, float, float, list[int], int, list[tuple[int, int, list[tuple[int, int]]]]
    ]: ...
    def step_stats(
        self, engines: Sequence[int], lo: int = 0, hi: int = ...
    ) -> tuple[int, float, float, float, int, float, float]: ...
    def step_starts(self, e: int) -> list[int]: ...

@final
class ChromeTraceEvents:
    """Spans to Chrome Trace Event JSON, the very text ``llmtrace.analysis.perfetto.ChromeTraceWriter``
    writes (``llmtrace.analysis._perfetto_native`` drives it). ``roles``: span name -> role
    bits; ``keys``: the 16 attribute keys it reads; ``limits``: ``(RECENT_PARENTS,
    PENDING_LIMIT, TRACK_CACHE, ORIGIN_LEAD_S)``; ``encode``, ``finite``, ``track_id``: the
    Python writer's helpers, for what it does not write itself. Span fields of the wrong
    type (a name that is not a ``str``, a time that is not an int within ±2**126) raise."""

    def __new__(
        cls,
        roles: Mapping[str, int],
        keys: Sequence[str],
        limits: tuple[int, int, int, int],
        args: bool,
        encode: Callable[[Any], bytes],
        finite: Callable[[Any], float | None],
        track_id: Callable[[str], int],
    ) -> ChromeTraceEvents: ...
    def add(self, spans: list[Any]) -> str: ...
    def finish(self) -> str: ...
    def stats(self) -> tuple[int, int, int, int, int, int, int, int | None]: ...
    def nbytes(self) -> int: ...

@final
class StepCounter:
    """The steps of an engine's unsampled window counted without Python
    (``llmtrace.lifecycle.engine.EngineTracer.attach_counter``): ``records``, the engine's open
    request records (steps are counted only while it is empty); ``batch_attr``, the attribute of
    a step's key object whose length is its batch size; ``busy_attr``, the engine's attribute that
    is empty once no request is left."""

    def __new__(cls, records: dict[Any, Any], batch_attr: str, busy_attr: str, max_pending: int) -> StepCounter: ...
    def allow(self, engine: object, deadline_ns: int, steps: int) -> None: ...
    def stop(self) -> None: ...
    def scheduled(self, engine: object, key: object, start_ns: int, end_ns: int) -> bool: ...
    def dispatched(self, key: object, at_ns: int) -> bool: ...
    def updated(self, engine: object, key: object, start_ns: int, end_ns: int) -> bool | None: ...
    def pending(self) -> int: ...
    def counted(self) -> int: ...
    def drain(self) -> tuple[list[int], int, bool, int, int] | None: ...

@final
class OtlpJsonEncoder:
    """SDK spans to OTLP/JSON text, the very text ``llmtrace._otel.otlp_json.encode_spans``
    writes in Python (that module builds and drives it). ``readable_span``, ``span_context``,
    ``status``: the SDK/API types whose fields it reads in place; ``kinds``/``codes``: the
    ``SpanKind``/``StatusCode`` members and their OTLP numbers; ``span_text``, ``any_value``,
    ``attributes``, ``resource_attributes``, ``quote``: the Python encoder's pieces, for what it
    does not write itself; ``links``: the Python encoder's cache of link texts by ``id``."""

    def __new__(
        cls,
        readable_span: type[Any],
        span_context: type[Any],
        status: type[Any],
        kinds: Sequence[tuple[Any, int]],
        codes: Sequence[tuple[Any, int]],
        span_text: Callable[[Any], str],
        any_value: Callable[[Any], str],
        attributes: Callable[[Any], str],
        resource_attributes: Callable[[Any], str],
        quote: Callable[[Any], str],
        links: dict[int, tuple[Any, str]],
        links_max: int,
    ) -> OtlpJsonEncoder: ...
    def encode(self, spans: Iterable[Any], pause: Callable[[], object] | None = None) -> str: ...

def asgi_send(downstream: Callable[[Any], Any], observe: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The ``send`` an ASGI app gets from llmtrace's middlewares
    (``llmtrace.integrations._asgi.app_send``): once ``observe`` has returned for a message of type
    ``http.response.body`` with a non-empty ``body``, a message that is an exact ``dict`` with a
    true ``more_body`` goes to ``downstream`` directly; every other message to ``observe``.
    Returns what the callee returns (the server's awaitable)."""

@final
class TokenizerMethod:
    """A tokenizer method llmtrace put on a class (``tokenizer_method``): binds like a function;
    carries a ``__dict__`` (``functools.update_wrapper``'s attributes, llmtrace's patch marker)."""

    def __get__(self, instance: object, owner: type | None = None, /) -> Callable[..., Any]: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def tokenizer_method(
    original: Callable[..., Any],
    timed: Callable[..., Any],
    fallback: Callable[..., Any],
    in_tokenizer: Any,
    observe: tuple[Any, Any] | None = None,
    failed: Callable[..., Any] | None = None,
) -> TokenizerMethod:
    """The method put in place of a tokenizer's ``original`` (native/src/tokenizer_method.rs): a call
    while ``in_tokenizer`` (a ``ContextVar[bool]``) is true, or inside a call passed through on this
    thread, goes to ``original`` as it came; with ``observe`` = ``(request_var, scope_var)``, a call
    whose current request — or, with none, server scope — has a false ``recording`` goes to
    ``original`` with this thread's pass-through flag (``tokenizer_passing_through``) set around it,
    one whose ``recording`` is true (and, without ``observe``, every call) to ``timed`` with that
    flag set around it too; a call it cannot decide to ``fallback``, the Python method. With
    ``failed`` (and ``observe``), a recorded call whose request is the current one, or the recording
    scope's last open one (none deferred), is timed here: ``original`` under the flag, its duration
    added to that request's ``detokenize_ns``; if it raises an ``Exception``, ``failed(elapsed_ns,
    exception, *args, **kwargs)`` reports it before the exception reaches the caller."""

def tokenizer_passing_through() -> bool:
    """Whether this thread runs a tokenizer call a ``tokenizer_method`` passed on, to ``original``
    or to ``timed`` (its nested calls then pass straight through)."""

def classify_gaps(
    engine_id: str,
    segs: Sequence[_Interval],
    forwards: list[Any],
    hosts: list[Any],
    host_cause: dict[str, int],
    extras: Sequence[tuple[int, int, int]],
    work: Sequence[_Interval],
    gap_type: type[_T],
    causes: tuple[str, ...],
) -> list[_T]: ...
def critical_path(
    children: dict[str, Any], root: Any, overlap_allowance_ns: int, section_type: type[_T]
) -> list[_T]: ...
def path_totals(
    requests: list[tuple[dict[str, Any], Any, int | None, str]], overlap_allowance_ns: int
) -> tuple[dict[str, list[int]], dict[tuple[str, ...], int], int, dict[tuple[str, str], tuple[str, float]]]: ...
def scans(data: bytes) -> bool: ...
