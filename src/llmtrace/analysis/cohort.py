"""Cohort comparison: which request attributes explain a selection, and how its traces differ.

``llmtrace compare SOURCE --where 'ttft>p95'`` splits the requests in two — the selection
and the rest (or a second ``--where``) — and ranks every attribute value by how much more
often it occurs in the selection than in the other cohort (TraceQL's ``compare()``). Each
request is described by categorical *features*::

    prompt        input-token bucket (powers of two: "513-1024")
    cached        share of the prompt served from the prefix cache ("0%", "1-50%", "50-90%",
                  ">=90%"; prefix_cache.cached_share); requests that do not report it have
                  no value (not "0%")
    preempted     "yes" / "no" (llm.preemptions)
    batch@arrival the engine's batch size at the step running when the request arrived (bucket)
    waiting@arrival  requests waiting at that step (bucket)
    engine, model, lora (llm.request.lora), service

A value's *effect* is its share in the selection minus its share in the other cohort
(percentage points; 1.0 means every selected request has it and no other does); *lift*
is the ratio of the two shares. The ranking is by effect: a value present in every slow
request and in no fast one ranks first, whatever its frequency elsewhere.

The structural diff compares the two cohorts' span shapes: per phase of the request and
for the engine steps that served it, how often it occurs per request and its mean length;
a name present in only one cohort is added/removed, one longer by :data:`LONGER_RATIO` is
longer.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmtrace import semconv as sc
from llmtrace.analysis.model import RequestView, TraceSet, finite_number
from llmtrace.analysis.prefix_cache import cached_share
from llmtrace.analysis.selection import Selection, SelectionError, resolve

#: A value must reach this many selected requests to be ranked (one odd request is noise),
#: unless the selection is smaller (one trace against another).
MIN_COUNT = 2
#: A phase or step this much longer on average (mean per request) is reported as longer.
LONGER_RATIO = 1.2


@dataclass(frozen=True, slots=True)
class Factor:
    """One attribute value and how over-represented it is in the selection."""

    feature: str
    value: str
    selected: int  # selected requests with this value
    other: int  # requests of the other cohort with it
    selected_share: float
    other_share: float
    effect: float  # selected_share - other_share
    lift: float | None  # selected_share / other_share (None: absent from the other cohort)


@dataclass(frozen=True, slots=True)
class ShapeDelta:
    """One span name in the two cohorts' structure."""

    name: str
    change: str  # "added" | "removed" | "longer" | "shorter" | "same"
    selected_per_request: float
    other_per_request: float
    selected_mean_s: float
    other_mean_s: float


@dataclass(frozen=True, slots=True)
class CohortComparison:
    selection: str
    other: str
    selected: int
    other_count: int
    factors: tuple[Factor, ...]
    structure: tuple[ShapeDelta, ...]
    #: Features no request had (e.g. no cached-token attribute anywhere): nothing to rank.
    absent: tuple[str, ...]


def _bucket_pow2(n: float) -> str:
    if n <= 0:
        return "0"
    hi = 1
    while hi < n:
        hi *= 2
    lo = hi // 2 + 1
    return str(hi) if lo >= hi else f"{lo}-{hi}"


def _cached_bucket(rv: RequestView) -> str | None:
    share = cached_share(rv)
    if share is None:
        return None
    if share <= 0:
        return "0%"
    if share < 0.5:
        return "1-50%"
    return "50-90%" if share < 0.9 else ">=90%"


class _EngineIndex:
    """Per engine, steps by start time; per request span, the engine that served it."""

    def __init__(self, ts: TraceSet) -> None:
        self.starts: dict[str, list[int]] = {}
        self.steps: dict[str, list[tuple[float | None, float | None]]] = {}
        self.engine_of: dict[str, str] = {}
        self.served: dict[str, list[float]] = defaultdict(list)
        for eid, engine in ts.engines.items():
            ordered = sorted(engine.steps, key=lambda st: st.step.start_ns)
            self.starts[eid] = [st.step.start_ns for st in ordered]
            # Read from the attributes (StepView says 0 for an absent one: not a measurement).
            self.steps[eid] = [
                (
                    finite_number(st.step.attributes.get(sc.LLM_BATCH_SIZE)),
                    finite_number(st.step.attributes.get(sc.LLM_QUEUE_WAITING)),
                )
                for st in ordered
            ]
            for st in ordered:
                dur = (st.step.end_ns - st.step.start_ns) / 1e9
                for link in st.step.links:
                    self.engine_of.setdefault(link.span_id, eid)
                    self.served[link.span_id].append(dur)

    def at_arrival(self, rv: RequestView) -> tuple[str | None, tuple[float | None, float | None] | None]:
        eid = self.engine_of.get(rv.request.span_id)
        if eid is None and len(self.starts) == 1:
            eid = next(iter(self.starts))
        if eid is None:
            return None, None
        i = bisect.bisect_right(self.starts[eid], rv.request.start_ns) - 1
        return eid, (self.steps[eid][i] if i >= 0 else None)


def features(rv: RequestView, index: _EngineIndex) -> dict[str, str]:
    """The categorical description of one request (absent attributes have no entry)."""
    out: dict[str, str] = {}
    if rv.input_tokens is not None:
        out["prompt"] = _bucket_pow2(rv.input_tokens)
    cached = _cached_bucket(rv)
    if cached is not None:
        out["cached"] = cached
    pre = rv.num(sc.LLM_PREEMPTIONS)
    if pre is not None:
        out["preempted"] = "yes" if pre > 0 else "no"
    eid, step = index.at_arrival(rv)
    if eid is not None:
        out["engine"] = eid
    if step is not None:
        batch, waiting = step
        if batch is not None:
            out["batch@arrival"] = _bucket_pow2(batch)
        if waiting is not None:
            out["waiting@arrival"] = _bucket_pow2(waiting)
    attrs = rv.request.attributes
    for feature, keys in (
        ("model", (sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_RESPONSE_MODEL)),
        ("lora", (sc.LLM_REQUEST_LORA,)),
    ):
        for key in keys:
            value = attrs.get(key)
            if value is not None and value != "":
                out[feature] = str(value)
                break
    service = (rv.server or rv.request).service
    if service:
        out["service"] = service
    return out


FEATURES = ("prompt", "cached", "preempted", "batch@arrival", "waiting@arrival", "engine", "model", "lora", "service")


def rank_factors(selected: Sequence[Mapping[str, str]], other: Sequence[Mapping[str, str]]) -> tuple[Factor, ...]:
    """Every (feature, value) seen at least :data:`MIN_COUNT` times in the selection (or in
    all of a smaller one), most over-represented first (effect, then lift, then count)."""
    if not selected or not other:
        return ()
    sel_counts: Counter[tuple[str, str]] = Counter(kv for f in selected for kv in f.items())
    oth_counts: Counter[tuple[str, str]] = Counter(kv for f in other for kv in f.items())
    out = []
    least = min(MIN_COUNT, len(selected))
    for (feature, value), n in sel_counts.items():
        if n < least:
            continue
        m = oth_counts.get((feature, value), 0)
        s_share, o_share = n / len(selected), m / len(other)
        lift = s_share / o_share if o_share else None
        out.append(Factor(feature, value, n, m, s_share, o_share, s_share - o_share, lift))
    out.sort(key=lambda f: (-f.effect, -(f.lift if f.lift is not None else float("inf")), -f.selected, f.feature))
    return tuple(out)


def _shape(requests: Sequence[RequestView], index: _EngineIndex) -> dict[str, tuple[float, float]]:
    """Per span name: occurrences per request, mean seconds per occurrence."""
    counts: Counter[str] = Counter()
    total: dict[str, float] = defaultdict(float)
    for rv in requests:
        for name, spans in rv.phases.items():
            counts[name] += len(spans)
            total[name] += sum(s.end_ns - s.start_ns for s in spans) / 1e9
        served = index.served.get(rv.request.span_id, ())
        counts[sc.SPAN_STEP] += len(served)
        total[sc.SPAN_STEP] += sum(served)
    n = max(1, len(requests))
    return {name: (c / n, total[name] / c) for name, c in counts.items() if c}


def structure_diff(
    selected: Sequence[RequestView], other: Sequence[RequestView], index: _EngineIndex
) -> tuple[ShapeDelta, ...]:
    a, b = _shape(selected, index), _shape(other, index)
    out = []
    for name in sorted(set(a) | set(b)):
        (ca, ma), (cb, mb) = a.get(name, (0.0, 0.0)), b.get(name, (0.0, 0.0))
        if name not in b:
            change = "added"
        elif name not in a:
            change = "removed"
        elif ca * ma > LONGER_RATIO * cb * mb:
            change = "longer"
        elif cb * mb > LONGER_RATIO * ca * ma:
            change = "shorter"
        else:
            change = "same"
        out.append(ShapeDelta(name, change, ca, cb, ma, mb))
    order = {"added": 0, "longer": 1, "removed": 2, "shorter": 3, "same": 4}
    out.sort(key=lambda d: (order[d.change], -(d.selected_per_request * d.selected_mean_s)))
    return tuple(out)


def compare_cohorts(ts: TraceSet, selection: Selection, other: Selection | None = None) -> CohortComparison:
    """Split ``ts``'s requests by ``selection`` (against ``other``, or everything else) and
    explain the split. Raises :class:`SelectionError` when a cohort is empty."""
    index = _EngineIndex(ts)
    requests = ts.requests
    pick: Callable[[RequestView], bool] = resolve(selection, requests, index.engine_of)
    chosen = [rv for rv in requests if pick(rv)]
    if other is not None:
        pick_other = resolve(other, requests, index.engine_of)
        rest = [rv for rv in requests if pick_other(rv)]
    else:
        rest = [rv for rv in requests if not pick(rv)]
    if not chosen:
        raise SelectionError(f"--where {selection.text!r} selects none of the {len(requests)} requests")
    if not rest:
        label = repr(other.text) if other is not None else "the rest"
        raise SelectionError(f"the cohort to compare against ({label}) is empty")
    sel_f = [features(rv, index) for rv in chosen]
    oth_f = [features(rv, index) for rv in rest]
    seen = {k for f in sel_f + oth_f for k in f}
    return CohortComparison(
        selection=selection.text,
        other=other.text if other is not None else "rest",
        selected=len(chosen),
        other_count=len(rest),
        factors=rank_factors(sel_f, oth_f),
        structure=structure_diff(chosen, rest, index),
        absent=tuple(f for f in FEATURES if f not in seen),
    )


__all__ = ["FEATURES", "CohortComparison", "Factor", "ShapeDelta", "compare_cohorts", "features", "rank_factors"]
