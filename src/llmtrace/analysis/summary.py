"""The analysis pipeline and its versioned JSON summary.

:func:`analyze` runs every analyzer over a :class:`~llmtrace.analysis.model.TraceSet` and
returns an :class:`Analysis`; :func:`to_json` turns it into the documented summary
(docs/analysis.md, "JSON summary"), which ``llmtrace compare`` reads back. Bump
:data:`SCHEMA_VERSION` on any incompatible change to the summary's keys or meaning.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, TypeVar

from llmtrace import semconv as sc
from llmtrace._version import __version__
from llmtrace.analysis import bottleneck as bn
from llmtrace.analysis._gc import paused_gc
from llmtrace.analysis._kernels import KERNELS
from llmtrace.analysis._steps import StepStats
from llmtrace.analysis.anomalies import Anomaly, find_anomalies
from llmtrace.analysis.breakdown import PhaseStats, phase_breakdown, request_phases
from llmtrace.analysis.client_join import join_client_server
from llmtrace.analysis.critical_path import SegmentStats, request_paths
from llmtrace.analysis.gpu_idle import EngineIdle, engine_idle
from llmtrace.analysis.model import EngineView, RequestView, StatusCode, TraceSet
from llmtrace.analysis.prefix_cache import PrefixCacheStats, prefix_cache_stats
from llmtrace.analysis.stats import pcts

_T = TypeVar("_T")
_START = attrgetter("start_ns")
_END = attrgetter("end_ns")
SCHEMA = "llmtrace.analysis"
SCHEMA_VERSION = 1
#: Per-request samples kept in the summary for ``compare``'s significance test; a stride
#: subsample beyond this keeps the file small (the test's power is saturated long before).
MAX_SAMPLES = 5000
#: Steps drawn in the HTML engine timeline; more would not be legible at any zoom.
TIMELINE_STEPS = 160
#: Points in the HTML scatter plot.
MAX_SCATTER = 4000
#: Per-window verdicts listed in the summary (the class counts cover all windows).
MAX_WINDOWS = 200


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    engine_id: str
    start_ns: int
    end_ns: int
    diagnosis: bn.Diagnosis


@dataclass(frozen=True, slots=True)
class Analysis:
    source: str
    span_count: int
    trace_count: int
    warnings: tuple[str, ...]
    requests: Mapping[str, Any]
    phases: tuple[PhaseStats, ...]
    critical_path: tuple[SegmentStats, ...]
    folded: Mapping[tuple[str, ...], int]
    idle: tuple[EngineIdle, ...]
    diagnosis: bn.Diagnosis
    windows: tuple[WindowVerdict, ...]
    anomalies: tuple[Anomaly, ...]
    samples: Mapping[str, list[float]]
    views: Mapping[str, Any] = field(default_factory=dict)
    #: None where no engine reported prompt provenance.
    prefix_cache: PrefixCacheStats | None = None
    #: Client and server joined, when a load client's CLIENT spans are in the traces
    #: (analysis/client_join.py); None otherwise.
    client: Mapping[str, Any] | None = None


def _stride(values: Sequence[_T], cap: int) -> list[_T]:
    if len(values) <= cap:
        return list(values)
    step = len(values) / cap
    return [values[int(i * step)] for i in range(cap)]


def _dist(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "mean": math.nan}
    out = pcts(values, (50, 90, 99))
    out["mean"] = sum(values) / len(values)
    return out


def _tpot(r: RequestView) -> float | None:
    tpot = r.num(sc.LLM_TPOT_S)
    if tpot is not None:
        return tpot
    ttft, n = r.ttft_s, r.output_tokens
    if ttft is None or n is None or n < 2:
        return None
    return (r.e2e_s - ttft) / (n - 1)


def analyze(ts: TraceSet, *, source: str = "", overlap_allowance_ns: int = 0) -> Analysis:
    """Run every analyzer; pure function of ``ts``."""
    with paused_gc():
        return _analyze(ts, source, overlap_allowance_ns)


def _analyze(ts: TraceSet, source: str, overlap_allowance_ns: int) -> Analysis:
    reqs = ts.requests
    cp_stats, folded, dominant = request_paths(reqs, overlap_allowance_ns=overlap_allowance_ns)
    per_phase = [request_phases(r) for r in reqs]
    e2e = [r.e2e_s for r in reqs]
    phases = phase_breakdown(per_phase, e2e)
    share = {p.phase: p.share for p in phases}
    idle = tuple(engine_idle(e, reqs, ts.tokenize) for e in ts.engines.values())
    prefix = prefix_cache_stats(reqs)
    diagnosis = bn.diagnose(
        bn.features(idle, _all_step_stats(ts.engines), reqs, share.get("queue", 0.0), share.get("network", 0.0),
                    share.get("prefill", 0.0), prefix)
    )
    starts = [_step_starts(e) for e in ts.engines.values()]  # read by the windows and the timeline
    windows = tuple(_window_verdicts(ts.engines, idle, starts))
    anomalies = tuple(find_anomalies(reqs, dominant))
    ttfts = [v for r in reqs if (v := r.ttft_s) is not None]
    tpot = [v for r in reqs if (v := _tpot(r)) is not None]
    samples = {
        "ttft_s": _stride(ttfts, MAX_SAMPLES),
        "e2e_s": _stride(e2e, MAX_SAMPLES),
        "tpot_s": _stride(tpot, MAX_SAMPLES),
        "queue_s": _stride([p["queue"] for p in per_phase], MAX_SAMPLES),
    }
    analysis = Analysis(
        source,
        ts.span_count,
        len(ts.traces),
        ts.warnings,
        _request_stats(reqs, ttfts, e2e, tpot),
        tuple(phases),
        tuple(cp_stats),
        folded,
        idle,
        diagnosis,
        windows,
        anomalies,
        samples,
    )
    views: dict[str, Any] = {
        "timeline": _timeline(ts.engines, idle, starts),
        "scatter": _scatter(reqs, anomalies),
    }
    if prefix is not None:
        views["ttft_vs_cached"] = [list(p) for p in prefix.points]
    client = join_client_server(reqs, lambda lo, hi: _classes_between(windows, lo, hi))
    fields = {f: getattr(analysis, f) for f in Analysis.__dataclass_fields__}
    return Analysis(**{**fields, "views": views, "prefix_cache": prefix, "client": client})


def _classes_between(windows: Sequence[WindowVerdict], start_ns: int, end_ns: int) -> dict[str, int]:
    """Bottleneck classes of the engine windows overlapping ``[start_ns, end_ns]``, counted."""
    counts: dict[str, int] = {}
    for w in windows:
        if w.start_ns <= end_ns and w.end_ns >= start_ns:
            counts[w.diagnosis.cls.value] = counts.get(w.diagnosis.cls.value, 0) + 1
    return counts


def _request_stats(
    reqs: Sequence[RequestView], ttft: list[float], e2e: list[float], tpot: list[float]
) -> dict[str, Any]:
    span_s = ((max(r.root.end_ns for r in reqs) - min(r.root.start_ns for r in reqs)) / 1e9) if reqs else 0.0
    out_tokens = sum(r.output_tokens or 0 for r in reqs)
    return {
        "count": len(reqs),
        "errors": sum(1 for r in reqs if r.request.status == StatusCode.ERROR),
        "ttft_s": _dist(ttft),
        "e2e_s": _dist(e2e),
        "tpot_s": _dist(tpot),
        "input_tokens": _dist([float(n) for r in reqs if (n := r.input_tokens) is not None]),
        "output_tokens": _dist([float(n) for r in reqs if (n := r.output_tokens) is not None]),
        "duration_s": span_s,
        "throughput_rps": len(reqs) / span_s if span_s > 0 else 0.0,
        "output_tokens_per_s": out_tokens / span_s if span_s > 0 else 0.0,
    }


def _all_step_stats(engines: Mapping[str, EngineView]) -> StepStats:
    """Step statistics of every engine's steps, one engine after another."""
    return KERNELS.step_stats(list(engines.values()))


def _step_starts(e: EngineView) -> list[int]:
    return KERNELS.engine(e).step_starts()


def _window_verdicts(
    engines: Mapping[str, EngineView], idle: Sequence[EngineIdle], step_starts: Sequence[list[int]]
) -> list[WindowVerdict]:
    out = []
    for e, ei, starts in zip(engines.values(), idle, step_starts, strict=True):
        steps = KERNELS.engine(e)
        for w, wi in zip(e.windows, ei.windows, strict=True):
            stats = steps.step_stats(bisect_left(starts, w.start_ns), bisect_right(starts, w.end_ns))
            f = bn.window_features(w, stats, wi.idle_ns, wi.with_work_ns, wi.causes)
            out.append(WindowVerdict(e.engine_id, w.start_ns, w.end_ns, bn.diagnose(f)))
    return out


def _timeline(
    engines: Mapping[str, EngineView], idle: Sequence[EngineIdle], step_starts: Sequence[list[int]]
) -> dict[str, Any]:
    """The busiest engine's steps around its largest idle-with-work gap, relative microseconds."""
    if not engines:
        return {}
    e, ei, starts = max(zip(engines.values(), idle, step_starts, strict=True), key=lambda p: len(p[0].steps))
    if not e.steps:
        return {}
    worst = ei.worst  # the first gap with the most work waiting, then the longest
    center = bisect_left(starts, worst.start_ns) if worst else 0
    lo = max(0, center - TIMELINE_STEPS // 2)
    steps = e.steps[lo : lo + TIMELINE_STEPS]
    t0, t1 = steps[0].step.start_ns, steps[-1].step.end_ns

    def rel(ns: int) -> float:
        return round((ns - t0) / 1e3, 1)

    return {
        "engine_id": e.engine_id,
        "t0_ns": t0,
        "duration_us": rel(t1),
        "steps": [[rel(s.step.start_ns), rel(s.step.end_ns), s.step_id, s.batch_size] for s in steps],
        "forwards": [[rel(f.start_ns), rel(f.end_ns)] for s in steps for f in s.forwards],
        "host": [[rel(h.start_ns), rel(h.end_ns), h.name] for s in steps for h in s.host],
        "gc": [[rel(g.start_ns), rel(g.end_ns)] for g in e.gc if t0 <= g.start_ns <= t1],
        "gaps": [
            [rel(max(g.start_ns, t0)), rel(min(g.end_ns, t1)), g.main_cause, g.work_waiting_ns > 0]
            for g in ei.gaps[bisect_right(ei.gaps, t0, key=_END) : bisect_left(ei.gaps, t1, key=_START)]
        ],
    }


def _scatter(reqs: Sequence[RequestView], anomalies: Sequence[Anomaly]) -> list[list[Any]]:
    flagged = {a.trace_id for a in anomalies}
    pts = [[r.input_tokens or 0, r.ttft_s, r.e2e_s, r.trace.trace_id in flagged] for r in reqs]
    return _stride(pts, MAX_SCATTER)


def _num(x: float) -> float | None:
    return None if isinstance(x, float) and (math.isnan(x) or math.isinf(x)) else round(x, 9)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return _num(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def _diag_json(d: bn.Diagnosis) -> dict[str, Any]:
    return {
        "class": d.cls.value,
        "score": d.score,
        "evidence": dict(d.evidence),
        "recommendation": d.recommendation,
        "scores": dict(d.scores),
    }


def to_json(a: Analysis, *, include_views: bool = False) -> dict[str, Any]:
    """The versioned summary (see docs/analysis.md for every key)."""
    counts: dict[str, int] = {}
    for w in a.windows:
        counts[w.diagnosis.cls.value] = counts.get(w.diagnosis.cls.value, 0) + 1
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "generator": f"llmtrace {__version__}",
        "source": {
            "name": a.source,
            "spans": a.span_count,
            "traces": a.trace_count,
            "warnings": list(a.warnings),
        },
        "requests": a.requests,
        "breakdown": {
            p.phase: {
                "mean_s": p.mean_s,
                "p50_s": p.p50_s,
                "p90_s": p.p90_s,
                "p99_s": p.p99_s,
                "share": p.share,
            }
            for p in a.phases
        },
        "critical_path": {
            s.name: {
                "share": s.share,
                "total_s": s.total_s,
                "requests": s.requests,
                "p50_s": s.p50_s,
                "p95_s": s.p95_s,
                "p99_s": s.p99_s,
            }
            for s in a.critical_path
        },
        "critical_path_stacks": [[";".join(k), v / 1e9] for k, v in sorted(a.folded.items(), key=lambda kv: -kv[1])],
        "gpu_idle": {
            e.engine_id: {
                "ratio": e.ratio,
                "total_s": e.idle_ns / 1e9,
                "covered_s": e.covered_ns / 1e9,
                "gaps": e.gap_count,
                "with_work_waiting_s": e.with_work_waiting_ns / 1e9,
                "upstream_s": e.upstream_ns / 1e9,
                "nothing_to_do_s": e.nothing_to_do_ns / 1e9,
                "by_cause_s": {k: v / 1e9 for k, v in e.by_cause_ns.items()},
                "gap_p50_s": e.gap_p50_ns / 1e9,
                "gap_p99_s": e.gap_p99_ns / 1e9,
                "steps": e.steps,
                "top_gaps": [
                    {
                        "start_ns": g.start_ns,
                        "duration_s": g.duration_ns / 1e9,
                        "cause": g.main_cause,
                        "work_waiting_s": g.work_waiting_ns / 1e9,
                    }
                    for g in e.top_gaps
                ],
            }
            for e in a.idle
        },
        "bottleneck": {
            **_diag_json(a.diagnosis),
            "window_classes": counts,
            "windows": [
                {
                    "engine_id": w.engine_id,
                    "start_ns": w.start_ns,
                    "end_ns": w.end_ns,
                    **_diag_json(w.diagnosis),
                }
                for w in a.windows[:MAX_WINDOWS]
            ],
        },
        "anomalies": [
            {
                "trace_id": x.trace_id,
                "request_id": x.request_id,
                "metric": x.metric,
                "value": x.value,
                "bucket": x.bucket,
                "median": x.median,
                "z": x.z,
                "input_tokens": x.input_tokens,
                "dominant_segment": x.dominant_segment,
                "dominant_s": x.dominant_s,
            }
            for x in a.anomalies
        ],
        "samples": a.samples,
    }
    if a.prefix_cache is not None:
        p = a.prefix_cache
        out["prefix_cache"] = {
            "requests": p.requests,
            "hit_ratio": p.hit_ratio,
            "hit_requests": p.hit_requests,
            "tokens": {"computed": p.computed_tokens, "cached": p.cached_tokens, "transferred": p.transferred_tokens},
            "ttft_p50_s": {"hit": p.ttft_hit_p50_s, "miss": p.ttft_miss_p50_s},
        }
    if a.client is not None:
        out["client"] = a.client
    if include_views:
        out["views"] = a.views
    return _clean(out)  # type: ignore[no-any-return]
