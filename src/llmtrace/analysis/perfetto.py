"""Spans to Chrome Trace Event JSON, streamed: what ``llmtrace export --format perfetto`` writes.

The output opens in ui.perfetto.dev and chrome://tracing (JSON object format, complete
``X`` events, ``M`` metadata, ``C`` counters, flow v1 ``s``/``f`` pairs)::

    process "<service> (pid N)"            one per exporting process (service + process.pid)
      thread "engine dp0"                  llm.step > schedule/forward/sample/postprocess, llm.gc:
                                           the scheduler timeline of one engine
      thread "engine dp0 windows"          its llm.engine windows
      counters "dp0 queue" running/waiting, "dp0 kv cache", "gpu 0" utilization/memory/power
      thread "trace 1a2b3c4d"              any other span (an HTTP SERVER span, a client span),
                                           one track per trace
    process "llm requests"
      thread "req cmpl-7"                  llm.request > tokenize/queue/prefill/decode, one
                                           track per request (requests overlap)
    flow arrows                            each request -> every llm.step that served it (the
                                           step's span links; drawn from the request's phase)

A phase that outlasts its request (an aborted request's last decode step) is drawn inside
it: clipped to the request's end when the request was read first, or the request drawn to
the phase's end when the phase was; :data:`CLIPPED_ARG` / :data:`EXTENDED_ARG` on the slice
say by how many nanoseconds.

Memory does not grow with the input: spans are written as they are read. The only state
is bounded — process/engine track ids (a handful), the recent engine-side spans that
children look their track up by (:data:`RECENT_PARENTS`), and children waiting for a
parent not read yet (:data:`PENDING_LIMIT`; past it they go to their trace's track).
A request's track id is derived from its span id, so a step's flow reaches the request's
track without remembering anything about the request.
"""

from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from llmtrace import semconv as sc
from llmtrace.analysis.model import Span, finite_number

#: Engine-side spans remembered so that a child read after them (llm.schedule under
#: llm.step) lands on their track: a window's spans arrive together, so a few windows' worth
#: (a window is ~64-1000 steps) is plenty.
RECENT_PARENTS = 16_384
#: Children read before their parent wait this many at most (an exporter batch ends
#: children before the parent); past it the oldest go to their trace's track.
PENDING_LIMIT = 65_536
#: Tracks whose name was written, and request track ids computed, remembered at most:
#: forgetting one costs a repeated name event or one more hex parse, nothing else.
TRACK_CACHE = 4_096
#: The time origin is this long before the first span read, so that the spans read later
#: but starting earlier (input is not sorted) still get positive timestamps.
ORIGIN_LEAD_S = 3600
#: Slice args that say a phase was drawn shorter, or its request longer, than the span: a
#: thread track needs every child inside its parent (Perfetto drops a child that outlasts
#: it), and the engine may still finish a decode step after the client aborted the request.
CLIPPED_ARG = "llmtrace.export.clipped_ns"
EXTENDED_ARG = "llmtrace.export.extended_ns"
#: The process that holds one track per request.
REQUESTS_PID = 1
_REQUESTS_NAME = "llm requests"
#: The exporter's request span (llmtrace's, or vLLM's own).
_REQUEST_NAMES = frozenset((sc.SPAN_REQUEST, sc.VLLM_SPAN_REQUEST))
_PHASES = frozenset(sc.REQUEST_PHASE_SPANS)
#: Engine-side spans that parent others (their children may not carry llm.engine.id).
_PARENTS = frozenset((sc.SPAN_ENGINE, sc.SPAN_STEP, sc.SPAN_FORWARD))
#: Spans whose GPU attributes become counter samples: snapshots over one step or forward
#: (a request's are means over its whole life, an engine window's over a second).
_GPU_SPANS = frozenset((sc.SPAN_STEP, sc.SPAN_FORWARD))
#: Spans that wait for an engine-side parent read later (others go to their trace's track).
_WAITERS = frozenset((*sc.STEP_CHILD_SPANS, sc.SPAN_GC, sc.SPAN_LAYER, sc.SPAN_STEP))
_GIB = 1024**3

#: JSON bytes of a value: msgspec (the analysis extra) when installed, ~5x faster than
#: json.dumps and called straight from C; a value of an unknown type is written as its str.
_encode_json: Callable[[Any], bytes]
try:
    import msgspec

    _encode_json = msgspec.json.Encoder(enc_hook=str).encode
except ImportError:  # pragma: no cover - depends on the environment

    def _encode_json(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), default=str).encode()


def _dumps(value: Any) -> str:
    return _encode_json(value).decode()


#: The document's start: the requests process, named and sorted first.
HEAD = (
    '{"traceEvents":[\n'
    f'{{"ph":"M","name":"process_name","pid":{REQUESTS_PID},"tid":0,"args":{{"name":"{_REQUESTS_NAME}"}}}}'
    f',\n{{"ph":"M","name":"process_sort_index","pid":{REQUESTS_PID},"tid":0,"args":{{"sort_index":1000}}}}'
)


def tail(source: str, origin_ns: int | None) -> str:
    """The document's end: what wrote it, from what, and the time origin of every ``ts``."""
    other = {"exporter": "llmtrace", "source": source, "time_origin_unix_ns": origin_ns or 0}
    return f'\n],"otherData":{_dumps(other)}}}\n'


def track_id(hex_id: str) -> int:
    """A thread id for a request or trace track, from its span or trace id: 31 bits (Chrome
    and Perfetto read tids as 32-bit), never 0 and never a small engine tid."""
    try:
        value = int(hex_id[-8:], 16) & 0x7FFFFFFF
    except ValueError:  # not hex (a hand-made id): any stable 31 bits of it
        value = zlib.crc32(hex_id.encode()) & 0x7FFFFFFF
    return value if value > 1024 else value + 1024


def _us(ns: int) -> str:
    """Nanoseconds as microseconds with three decimals, the digits exact."""
    if ns < 0:
        return "-" + _us(-ns)
    return f"{ns // 1000}.{ns % 1000:03d}"


@dataclass(frozen=True, slots=True)
class ExportStats:
    """What one export wrote."""

    spans: int
    slices: int
    flows: int
    counters: int
    processes: int
    engines: int
    #: Spans placed on their trace's track because their parent never arrived in time.
    unparented: int
    #: Phases clipped to their request, or requests drawn to their last phase's end.
    adjusted: int = 0


class ChromeTraceWriter:
    """Writes spans to ``out`` as they come; :meth:`close` ends the JSON document.

    ``args=False`` leaves span attributes out (a ~20% smaller file)."""

    def __init__(self, out: IO[str], *, args: bool = True, source: str = "") -> None:
        self._out = out
        self._args = args
        self._source = source
        self._processes: dict[tuple[str, str, str], int] = {}
        self._engines: dict[tuple[int, str, bool], int] = {}
        self._named_tracks: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._recent: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._pending: OrderedDict[str, list[Span]] = OrderedDict()
        self._pending_count = 0
        self._names: dict[str, str] = {}
        self._last_resource: Any = None
        self._last_pid = 0
        self._origin: int | None = None
        self._engine_names: dict[int, str] = {}
        self._request_tids: dict[str, int] = {}
        # Request span id -> its end, and the other way: parent id -> the latest end of the
        # phases read before it (both emptied when full: a best-effort, bounded memory).
        self._request_ends: dict[str, int] = {}
        self._phase_ends: dict[str, int] = {}
        self.spans = self.flows = self.counters = self.unparented = self.adjusted = 0
        # Events are collected per batch and written with one call; every event after the
        # first (the head's) is prefixed with its separator, so there is no "first?" test.
        self._buf: list[str] = []
        self._event = self._buf.append
        out.write(HEAD)

    # ------------------------------------------------------------------ output
    def _flush(self) -> None:
        self._out.write("".join(self._buf))
        self._buf.clear()

    def _ts(self, ns: int) -> str:
        """A timestamp relative to :attr:`origin_ns`. Readers parse ``ts`` as a double:
        a Unix-epoch time in microseconds keeps only a quarter-microsecond, which makes
        back-to-back phases overlap (and Perfetto drop one); an offset keeps every digit."""
        origin = self._origin
        if origin is None:
            origin = self._origin = (ns // 1_000_000_000 - ORIGIN_LEAD_S) * 1_000_000_000
        d = ns - origin
        if d < 0:
            return _us(d)
        return f"{d // 1000}.{d % 1000:03d}"

    def _quoted(self, name: str) -> str:
        q = self._names.get(name)
        if q is None:
            q = json.dumps(name)
            if len(self._names) < 4096:  # span names are few; a pathological input is not cached
                self._names[name] = q
        return q

    def _name_track(self, pid: int, tid: int, name: str, sort_index: int | None = None) -> None:
        key = (pid, tid)
        if key in self._named_tracks:
            return
        self._named_tracks[key] = None
        if len(self._named_tracks) > TRACK_CACHE:
            self._named_tracks.popitem(last=False)  # named again if it recurs: harmless
        self._event(
            f',\n{{"ph":"M","name":"thread_name","pid":{pid},"tid":{tid},"args":{{"name":{json.dumps(name)}}}}}'
        )
        if sort_index is not None:
            self._event(
                f',\n{{"ph":"M","name":"thread_sort_index","pid":{pid},"tid":{tid},"args":{{"sort_index":{sort_index}}}}}'
            )

    def _slice(self, span: Span, pid: int, tid: int) -> None:
        # The hottest function (once per span): formatting inlined, the attribute mapping
        # encoded as it is and the ids spliced in front (no copy of the mapping).
        start = span.start_ns
        d = start - self._origin if self._origin is not None else self._ts_offset(start)
        dur = span.end_ns - start
        dur = dur if dur > 0 else 0
        ts = f"{d // 1000}.{d % 1000:03d}" if d >= 0 else _us(d)
        name = self._names.get(span.name) or self._quoted(span.name)
        head = (
            f',\n{{"ph":"X","name":{name},"cat":"llmtrace","ts":{ts},'
            f'"dur":{dur // 1000}.{dur % 1000:03d},"pid":{pid},"tid":{tid},"args":{{"span_id":"{span.span_id}"'
        )
        attrs = span.attributes
        if not self._args:
            self._event(head + "}}")
        elif attrs:
            self._event(f'{head},"trace_id":"{span.trace_id}",{_encode_json(attrs).decode()[1:]}}}')
        else:
            self._event(f'{head},"trace_id":"{span.trace_id}"}}}}')

    def _ts_offset(self, ns: int) -> int:
        self._ts(ns)  # fixes the origin
        assert self._origin is not None
        return ns - self._origin

    # ------------------------------------------------------------------ tracks
    def _process(self, span: Span) -> int:
        resource = span.resource
        if resource is self._last_resource and resource:
            return self._last_pid
        proc = resource.get("process.pid")
        key = (span.service, "" if proc is None else str(proc), str(resource.get("host.name", "")))
        pid = self._processes.get(key)
        if pid is None:
            pid = self._processes[key] = REQUESTS_PID + 1 + len(self._processes)
            label = span.service or "unknown service"
            role = resource.get(sc.LLMTRACE_PROCESS_ROLE)
            if role:
                label += f" [{role}]"
            if proc is not None:
                label += f" (pid {proc})"
            self._event(
                f',\n{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":{json.dumps(label)}}}}}'
            )
        self._last_resource, self._last_pid = resource, pid
        return pid

    def _engine_track(self, pid: int, engine_id: str, *, windows: bool = False) -> int:
        """The engine's track (steps, their phases, gc), or the one beside it for its
        ``llm.engine`` windows: a window begins with its first step, and on one track a
        flow's end would bind to the window instead of that step."""
        key = (pid, engine_id, windows)
        tid = self._engines.get(key)
        if tid is None:
            tid = self._engines[key] = 1 + len(self._engines)
            label = f"engine {engine_id} windows" if windows else f"engine {engine_id}"
            self._name_track(pid, tid, label, sort_index=2 * tid + windows)
        return tid

    def _trace_track(self, span: Span) -> tuple[int, int]:
        pid = self._process(span)
        tid = track_id(span.trace_id)
        self._name_track(pid, tid, f"trace {span.trace_id[:8]}", sort_index=100_000)
        return pid, tid

    def _remember(self, span_id: str, track: tuple[int, int]) -> None:
        recent = self._recent
        recent[span_id] = track
        if len(recent) > RECENT_PARENTS:
            recent.popitem(last=False)
        waiting = self._pending.pop(span_id, None)
        if waiting is not None:
            self._pending_count -= len(waiting)
            for child in waiting:
                self._place_known(child, track)

    def _place_known(self, span: Span, track: tuple[int, int]) -> None:
        """Place a span on its parent's track; a parent itself is remembered in turn (its
        own children may be waiting for it)."""
        self._place_on(span, track)
        if span.name in _PARENTS:
            self._remember(span.span_id, track)

    # ------------------------------------------------------------------ spans
    def add(self, spans: Iterable[Span]) -> None:
        """Write ``spans`` (any order; a child may come before its parent)."""
        n = self.spans
        add = self._add
        for span in spans:
            n += 1
            add(span)
        self.spans = n
        self._flush()

    def _add(self, span: Span) -> None:
        name = span.name
        attrs = span.attributes
        if name in _REQUEST_NAMES:
            tid = track_id(span.span_id)
            rid = attrs.get(sc.LLM_REQUEST_ID) or attrs.get(sc.VLLM_REQUEST_ID) or span.span_id[:8]
            self._name_track(REQUESTS_PID, tid, f"req {rid}")
            later = self._phase_ends.pop(span.span_id, None)
            if later is not None and later > span.end_ns:
                span = self._adjusted(span, later, EXTENDED_ARG)
            ends = self._request_ends
            if len(ends) >= TRACK_CACHE:
                ends.clear()
            ends[span.span_id] = span.end_ns
            self._slice(span, REQUESTS_PID, tid)
            return
        if name in _PHASES and span.parent_id is not None:
            self._slice(self._phase_within(span, span.parent_id), REQUESTS_PID, track_id(span.parent_id))
            return
        engine_id = attrs.get(sc.LLM_ENGINE_ID)
        if engine_id is not None:
            pid = self._process(span)
            track = (pid, self._engine_track(pid, str(engine_id)))
            if name == sc.SPAN_ENGINE:
                # Its children (steps, gc) belong on the engine's track, the window beside it.
                self._remember(span.span_id, track)
                self._place_on(span, (pid, self._engine_track(pid, str(engine_id), windows=True)))
                return
            if name in _PARENTS:
                self._remember(span.span_id, track)
            self._place_on(span, track)
            return
        parent = span.parent_id
        if parent is not None:
            known = self._recent.get(parent)
            if known is not None:
                self._place_known(span, known)
                return
            if name in _WAITERS or sc.LLM_STEP_ID in attrs:
                self._wait_for(parent, span)
                return
        self._place_on(span, self._trace_track(span))

    def _phase_within(self, phase: Span, parent: str) -> Span:
        """``phase``, clipped to its request's end when the request was read and ended
        first; otherwise its end is remembered for the request to reach."""
        end = self._request_ends.get(parent)
        if end is not None:
            return self._adjusted(phase, end, CLIPPED_ARG) if phase.end_ns > end else phase
        ends = self._phase_ends
        if phase.end_ns > ends.get(parent, 0):
            if len(ends) >= TRACK_CACHE:
                ends.clear()
            ends[parent] = phase.end_ns
        return phase

    def _adjusted(self, span: Span, end_ns: int, arg: str) -> Span:
        self.adjusted += 1
        return span._replace(end_ns=end_ns, attributes={**span.attributes, arg: abs(span.end_ns - end_ns)})

    def _wait_for(self, parent: str, span: Span) -> None:
        waiting = self._pending.get(parent)
        if waiting is None:
            self._pending[parent] = [span]
        else:
            waiting.append(span)
        self._pending_count += 1
        while self._pending_count > PENDING_LIMIT:
            _, oldest = self._pending.popitem(last=False)
            self._pending_count -= len(oldest)
            self._orphans(oldest)

    def _orphans(self, spans: list[Span]) -> None:
        for child in spans:
            self.unparented += 1
            self._place_on(child, self._trace_track(child))

    def _place_on(self, span: Span, track: tuple[int, int]) -> None:
        pid, tid = track
        self._slice(span, pid, tid)
        name = span.name
        if name not in _GPU_SPANS:
            return
        if name == sc.SPAN_STEP:
            self._step_extras(span, pid, tid)
        attrs = span.attributes
        if sc.HW_GPU_UTILIZATION in attrs or sc.HW_GPU_POWER in attrs or sc.HW_GPU_MEMORY_USAGE in attrs:
            self._gpu_counter(span, pid)

    def _step_extras(self, step: Span, pid: int, tid: int) -> None:
        """The step's counters, and a flow between the step and each request it served."""
        attrs = step.attributes
        ts = self._ts(step.start_ns)
        engine = self._engine_names.get(tid)
        if engine is None:
            engine = self._engine_names[tid] = json.dumps(str(attrs.get(sc.LLM_ENGINE_ID, tid)))[1:-1]
        running = finite_number(attrs.get(sc.LLM_QUEUE_RUNNING))
        waiting = finite_number(attrs.get(sc.LLM_QUEUE_WAITING))
        kv = finite_number(attrs.get(sc.LLM_KV_CACHE_USAGE))
        if running is not None and waiting is not None:  # the usual step: one event, no dict
            self.counters += 1
            self._event(
                f',\n{{"ph":"C","name":"{engine} queue","ts":{ts},"pid":{pid},'
                f'"args":{{"running":{running!r},"waiting":{waiting!r}}}}}'
            )
        elif running is not None or waiting is not None:
            values = {k: v for k, v in (("running", running), ("waiting", waiting)) if v is not None}
            self._counter(f"{engine} queue", ts, pid, values)
        if kv is not None:
            self.counters += 1
            self._event(f',\n{{"ph":"C","name":"{engine} kv cache","ts":{ts},"pid":{pid},"args":{{"usage":{kv!r}}}}}')
        if not step.links:
            return
        # Perfetto binds a flow's start ("s") to the innermost slice open at its time, and an
        # end without "bp" to the next slice that begins on its track. So: the start on the
        # request's track just before the step (the request, in this step's batch, is open
        # then: it binds to the phase it was in), the end on the engine track just before
        # the step begins (it binds to the step, never to a child starting with it).
        start = f',"ts":{self._ts(step.start_ns - 2)},"pid":{REQUESTS_PID},"tid":'
        end = f',"ts":{self._ts(step.start_ns - 1)},"pid":{pid},"tid":{tid}}}'
        links = step.links
        tids = self._request_tids
        if len(tids) >= TRACK_CACHE:
            tids.clear()
        get = tids.get
        rtids = [get(link.span_id) or tids.setdefault(link.span_id, track_id(link.span_id)) for link in links]
        first = self.flows + 1
        self.flows += len(links)
        self._event(
            "".join(
                [
                    f',\n{{"ph":"s","name":"batch","cat":"llmtrace","id":{fid}{start}{rtid}}}'
                    f',\n{{"ph":"f","name":"batch","cat":"llmtrace","id":{fid}{end}'
                    for fid, rtid in zip(range(first, first + len(links)), rtids, strict=True)
                ]
            )
        )

    def _gpu_counter(self, span: Span, pid: int) -> None:
        attrs = span.attributes
        values: dict[str, float] = {}
        util = finite_number(attrs.get(sc.HW_GPU_UTILIZATION))
        if util is not None:
            values["utilization %"] = util * 100
        mem = finite_number(attrs.get(sc.HW_GPU_MEMORY_USAGE))
        if mem is not None:
            values["memory GiB"] = mem / _GIB
        power = finite_number(attrs.get(sc.HW_GPU_POWER))
        if power is not None:
            values["power W"] = power
        if values:
            device = json.dumps(str(attrs.get(sc.HW_GPU_ID, "")))[1:-1]
            self._counter(f"gpu {device}".rstrip(), self._ts(span.start_ns), pid, values)

    def _counter(self, name: str, ts: str, pid: int, values: Mapping[str, float]) -> None:
        self.counters += 1
        self._event(f',\n{{"ph":"C","name":"{name}","ts":{ts},"pid":{pid},"args":{_dumps(dict(values))}}}')

    # ------------------------------------------------------------------ end
    def close(self) -> ExportStats:
        """Place children whose parent never came, end the document, return the counts."""
        while self._pending:
            _, waiting = self._pending.popitem(last=False)
            self._orphans(waiting)
        self._pending_count = 0
        self._flush()
        self._out.write(tail(self._source, self._origin))
        return ExportStats(
            spans=self.spans,
            slices=self.spans,  # every span is one slice
            flows=self.flows,
            counters=self.counters,
            processes=len(self._processes) + 1,
            engines=sum(1 for _, _, windows in self._engines if not windows),
            unparented=self.unparented,
            adjusted=self.adjusted,
        )


def write_chrome_trace(
    batches: Iterable[Iterable[Span]], out: IO[str], *, args: bool = True, source: str = ""
) -> ExportStats:
    """Write every batch of spans to ``out`` as one Chrome Trace Event JSON document, with the
    compiled writer where it is in use (``_perfetto_native.writer_name``): the same text."""
    from llmtrace.analysis._perfetto_native import compiled_writer  # it reads this module's limits

    writer = compiled_writer(out, args=args, source=source) or ChromeTraceWriter(out, args=args, source=source)
    for batch in batches:
        writer.add(batch)
    return writer.close()


__all__ = ["HEAD", "ChromeTraceWriter", "ExportStats", "tail", "track_id", "write_chrome_trace"]
