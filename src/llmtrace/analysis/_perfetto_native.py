"""The compiled Chrome trace writer (``llmtrace_native.ChromeTraceEvents``, native/src/chrome/)
behind the interface of :class:`~llmtrace.analysis.perfetto.ChromeTraceWriter`.

:class:`~llmtrace.analysis.perfetto.ChromeTraceWriter` is the reference: the compiled
writer makes the same decisions in the same order and writes the same text, byte for byte
(``tests/analysis/test_perfetto_native.py`` exports the same spans through both). It
exists for speed: formatting every event in Python costs ~3.5 µs a span, the bulk of an
export (docs/perfetto.md, "Performance").

Which one :func:`~llmtrace.analysis.perfetto.write_chrome_trace` uses is
:func:`writer_name`. The compiled one is told the span names by role and the attribute keys
it reads (:data:`ROLES`, :data:`KEYS`), so it holds no name of :mod:`llmtrace.semconv`,
and reads the limits of :mod:`~llmtrace.analysis.perfetto` when it starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING

from llmtrace import semconv as sc
from llmtrace.analysis import perfetto
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis.errors import AnalysisError
from llmtrace.analysis.model import Span, finite_number

if TYPE_CHECKING:
    import llmtrace_native  # the stub, native/llmtrace_native.pyi

# Role bits of a span name, as native/src/chrome/mod.rs reads them.
_REQUEST, _PHASE, _PARENT, _GPU, _WAITER, _ENGINE, _STEP = (1 << i for i in range(7))


def _roles() -> dict[str, int]:
    """Span name -> role bits, from the very sets the Python writer tests names against."""
    sets = (
        (perfetto._REQUEST_NAMES, _REQUEST),
        (perfetto._PHASES, _PHASE),
        (perfetto._PARENTS, _PARENT),
        (perfetto._GPU_SPANS, _GPU),
        (perfetto._WAITERS, _WAITER),
        ({sc.SPAN_ENGINE}, _ENGINE),
        ({sc.SPAN_STEP}, _STEP),
    )
    roles: dict[str, int] = {}
    for names, bit in sets:
        for name in names:
            roles[name] = roles.get(name, 0) | bit
    return roles


#: Span name -> role bits.
ROLES = _roles()
#: The attribute keys the compiled writer reads, in the order it expects them.
KEYS = (
    sc.LLM_REQUEST_ID, sc.VLLM_REQUEST_ID, sc.LLM_ENGINE_ID, sc.LLM_STEP_ID, sc.LLM_QUEUE_RUNNING,
    sc.LLM_QUEUE_WAITING, sc.LLM_KV_CACHE_USAGE, sc.HW_GPU_UTILIZATION, sc.HW_GPU_MEMORY_USAGE, sc.HW_GPU_POWER,
    sc.HW_GPU_ID, sc.LLMTRACE_PROCESS_ROLE, "process.pid", "host.name", perfetto.CLIPPED_ARG, perfetto.EXTENDED_ARG,
)  # fmt: skip


def writer_name() -> str:
    """Which writer an export uses: ``native`` (the compiled one, where the compiled core is
    in use and its build has it) or ``python`` (:class:`~llmtrace.analysis.perfetto.ChromeTraceWriter`).
    ``LLMTRACE_EXPORT_WRITER`` picks one for tests and benchmarks; asking for ``native``
    where it is not there is an error."""
    choice = os.environ.get("LLMTRACE_EXPORT_WRITER", "")
    if choice not in ("", "native", "python"):
        raise AnalysisError(f"LLMTRACE_EXPORT_WRITER={choice!r}: use native or python")
    available = KERNELS.chrome_trace_events() is not None
    if choice == "native" and not available:
        raise AnalysisError(
            "LLMTRACE_EXPORT_WRITER=native, but the compiled writer is not in use (llmtrace-native not built, "
            "built from an older version, or LLMTRACE_ANALYSIS_NATIVE=0): pip install ./native"
        )
    return "native" if available and choice != "python" else "python"


class CompiledChromeTraceWriter:
    """The compiled writer, written to ``out`` batch by batch, as the Python one is."""

    def __init__(self, events: llmtrace_native.ChromeTraceEvents, out: IO[str], source: str) -> None:
        self._events = events
        self._out = out
        self._source = source
        out.write(perfetto.HEAD)

    def add(self, spans: Iterable[Span]) -> None:
        """Write ``spans`` (any order; a child may come before its parent)."""
        self._out.write(self._events.add(spans if isinstance(spans, list) else list(spans)))

    def nbytes(self) -> int:
        """Bytes of state the writer holds between batches (bounded: the limits it started with)."""
        return self._events.nbytes()

    def close(self) -> perfetto.ExportStats:
        """Place children whose parent never came, end the document, return the counts."""
        self._out.write(self._events.finish())
        spans, flows, counters, processes, engines, unparented, adjusted, origin = self._events.stats()
        self._out.write(perfetto.tail(self._source, origin))
        # Every span is one slice.
        return perfetto.ExportStats(spans, spans, flows, counters, processes, engines, unparented, adjusted)


def compiled_writer(out: IO[str], *, args: bool = True, source: str = "") -> CompiledChromeTraceWriter | None:
    """The compiled writer, or ``None`` where :func:`writer_name` says ``python``."""
    new = KERNELS.chrome_trace_events()
    if new is None or writer_name() != "native":
        return None
    limits = (perfetto.RECENT_PARENTS, perfetto.PENDING_LIMIT, perfetto.TRACK_CACHE, perfetto.ORIGIN_LEAD_S)
    events = new(ROLES, KEYS, limits, args, perfetto._encode_json, finite_number, perfetto.track_id)
    return CompiledChromeTraceWriter(events, out, source)


__all__ = ["KEYS", "ROLES", "CompiledChromeTraceWriter", "compiled_writer", "writer_name"]
