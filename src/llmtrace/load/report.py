"""The load report: per-step and overall numbers, goodput, capacity and the knee — pure functions.

:func:`summarize` turns a :class:`RunResult` into the JSON document (``--json``); the
terminal and HTML renderers only format that document.

Definitions (seconds; latencies from each request's intended send time):

* **achieved QPS** of a step: the successful answers that *completed* during the step (whichever
  step sent them) per second of it — throughput as the server delivered it; the last step's
  window runs on to its last answer, so a server that falls behind is not credited with the
  answers it owed; output tokens/s and goodput QPS count the same way;
* **error ratio**: server-side failures (HTTP error, broken connection, protocol error) over
  the step's requests that are not chaos and not cancelled; **timeout ratio** likewise;
* **goodput**: the share of those requests that succeeded and met every set SLO;
* **capacity**: the highest-load step whose p99 TTFT/TPOT/e2e each meet the SLO and whose
  error ratio is at most :data:`CAPACITY_MAX_ERROR_RATIO`;
* **knee**: the last step whose median e2e is within :data:`KNEE_FACTOR` of the lightest
  step's before every later step's is beyond it — the load after which latency leaves its
  plateau for good;
* **saturated at**: the first step from which on every step's achieved rate is under
  :data:`SATURATION_SHARE` of the rate it was sent at.
"""

from __future__ import annotations

import math
from typing import Any

from llmtrace.analysis.stats import percentile
from llmtrace.load.model import Outcome, RequestResult, RunResult, Slo, Step
from llmtrace.load.slo import describe

SCHEMA_VERSION = 1
#: A step with more failures than this is over capacity whatever its latency: at 1% errors an
#: operator is paging someone.
CAPACITY_MAX_ERROR_RATIO = 0.01
#: Latency "leaves the plateau" when the median e2e grows past this multiple of the lightest
#: step's: queueing, not noise (run-to-run noise on a loaded box stays well under 1.5x).
KNEE_FACTOR = 1.5
#: A step whose achieved rate is below this share of the rate it was sent at is saturated (the
#: sent rate, not the nominal one: a Poisson draw of a short step strays from the nominal rate).
SATURATION_SHARE = 0.9
#: The client is the bottleneck when its send lag p99 exceeds this (the schedule slips) ...
SELF_LAG_LIMIT_S = 0.005
#: ... or one of its processes is this busy (the event loop has no slack left).
SELF_CPU_LIMIT = 0.85
QUANTILES = (50, 90, 99)


def _pcts(values: list[float]) -> dict[str, float | None]:
    xs = sorted(values)
    return {f"p{q}": (percentile(xs, q, presorted=True) if xs else None) for q in QUANTILES}


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _end(r: RequestResult) -> float:
    return r.scheduled_s + (r.e2e_s or 0.0)


def _delivered(everything: list[RequestResult], step: Step, last: bool,
               slo: Slo) -> tuple[float, int, int, int | None]:
    """(window seconds, successful answers, their output tokens, those meeting the SLO) of the
    answers completed inside the step's window."""
    start, end = step.start_s, step.start_s + step.duration_s
    if last:
        end = max([end, *(_end(r) for r in everything)])
    done = [r for r in everything if r.outcome is Outcome.OK and start <= _end(r) < end + (1e-9 if last else 0.0)]
    met = sum(1 for r in done if slo.met_by(r)) if not slo.empty else None
    return max(end - start, 1e-9), len(done), sum(r.output_tokens for r in done), met


def summarize_results(results: list[RequestResult], step: Step, slo: Slo, everything: list[RequestResult],
                      last: bool) -> dict[str, Any]:
    """The numbers of one step: latencies of the requests it sent, throughput of the answers
    completed during it (*everything* is the whole run; *last*: the step is the run's last)."""
    ok = [r for r in results if r.outcome is Outcome.OK]
    counted = [r for r in results if r.outcome not in (Outcome.CHAOS, Outcome.CANCELLED)]
    window, delivered, tokens, delivered_met = _delivered(everything, step, last, slo)
    itl = [gap for r in ok for gap in r.itl_s]
    met = sum(1 for r in counted if slo.met_by(r)) if not slo.empty else None
    offered = step.qps if step.qps is not None else (len(results) / step.duration_s if step.duration_s else None)
    return {
        "step": step.index, "label": step.label, "start_s": step.start_s, "duration_s": step.duration_s,
        "offered_qps": offered, "concurrency": step.concurrency,
        "requests": len(results), "ok": len(ok),
        "sent_qps": len(counted) / step.duration_s if step.duration_s else None,
        "achieved_qps": delivered / window, "output_tokens_per_s": tokens / window,
        "outcomes": {o.value: n for o in Outcome if (n := sum(1 for r in results if r.outcome is o))},
        "chaos": {kind: n for kind in sorted({r.chaos.value for r in results if r.chaos})
                  if (n := sum(1 for r in results if r.chaos and r.chaos.value == kind))},
        "error_ratio": _ratio(sum(1 for r in counted if r.counts_as_server_error), len(counted)),
        "timeout_ratio": _ratio(sum(1 for r in counted if r.outcome is Outcome.TIMEOUT), len(counted)),
        "goodput": _ratio(met, len(counted)) if met is not None else None,
        "goodput_qps": delivered_met / window if delivered_met is not None else None,
        "ttft_s": _pcts([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_s": _pcts([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_s": _pcts(itl),
        "e2e_s": _pcts([r.e2e_s for r in ok if r.e2e_s is not None]),
        "send_lag_s": _pcts([r.send_lag_s for r in results]),
        "pool_wait_s": _pcts([r.pool_wait_s for r in results]),
    }


def meets_slo(step: dict[str, Any], slo: Slo) -> bool:
    """p99 of each set objective within it, and few enough errors."""
    if slo.empty or not step["ok"]:
        return False
    for key, limit in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s), ("e2e_s", slo.e2e_s)):
        p99 = step[key]["p99"]
        if limit is not None and (p99 is None or p99 > limit):
            return False
    return (step["error_ratio"] or 0.0) <= CAPACITY_MAX_ERROR_RATIO


def _load_of(step: dict[str, Any]) -> float:
    return float(step["concurrency"] if step["concurrency"] is not None else step["offered_qps"] or 0.0)


def capacity(steps: list[dict[str, Any]], slo: Slo) -> dict[str, Any] | None:
    """The highest-load step that meets the SLO (None: none does, or no SLO)."""
    passing = [s for s in steps if meets_slo(s, slo)]
    if not passing:
        return None
    best = max(passing, key=_load_of)
    return {"step": best["step"], "label": best["label"], "achieved_qps": best["achieved_qps"],
            "goodput_qps": best["goodput_qps"]}


def knee(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last step on the latency plateau before latency leaves it for good (None: it never
    does). A step off the plateau followed by one back on it is noise, not the knee: a
    shared host stalls a step now and then, and a knee the next step disowns misleads."""
    measured = sorted((s for s in steps if s["e2e_s"]["p50"] is not None), key=_load_of)
    if len(measured) < 2:
        return None
    limit = KNEE_FACTOR * measured[0]["e2e_s"]["p50"]
    above = [s["e2e_s"]["p50"] > limit for s in measured]
    first_off = _start_of_tail(above)
    if first_off is None or first_off == 0:
        return None
    previous, current = measured[first_off - 1], measured[first_off]
    return {"step": previous["step"], "label": previous["label"], "next_label": current["label"],
            "e2e_p50_s": previous["e2e_s"]["p50"], "next_e2e_p50_s": current["e2e_s"]["p50"]}


def _start_of_tail(flags: list[bool]) -> int | None:
    """Index of the first element of the longest all-True suffix (None: the last is False)."""
    if not flags or not flags[-1]:
        return None
    index = len(flags)
    while index > 0 and flags[index - 1]:
        index -= 1
    return index


def saturated_at(steps: list[dict[str, Any]]) -> str | None:
    """The first open-loop step from which on every step's answers fell behind the rate it was
    sent at (achieved < :data:`SATURATION_SHARE` of sent); one short step alone is noise."""
    rated = [s for s in steps if s["sent_qps"] and s["concurrency"] is None]
    start = _start_of_tail([s["achieved_qps"] < SATURATION_SHARE * s["sent_qps"] for s in rated])
    return None if start is None else str(rated[start]["label"])


def self_check_warnings(run: RunResult) -> list[str]:
    check = run.self_check
    warnings = []
    waits = sorted(r.pool_wait_s for r in run.results)
    if waits and (wait := percentile(waits, 99, presorted=True)) > SELF_LAG_LIMIT_S:
        warnings.append(f"requests waited for a connection of the client's own pool (--max-connections): p99 "
                        f"{wait * 1000:.0f} ms of their latency is the client's queue, not the server's")
    if check.send_lag_p99_s > SELF_LAG_LIMIT_S:
        warnings.append(f"the load client fell behind its schedule: send lag p99 {check.send_lag_p99_s * 1000:.1f} ms "
                        f"(> {SELF_LAG_LIMIT_S * 1000:g} ms); the client, not the server, may be the bottleneck "
                        "(try --processes N)")
    if check.cpu_share > SELF_CPU_LIMIT:
        warnings.append(f"the load client used {check.cpu_share:.0%} of a core per process: it may be the "
                        "bottleneck (try --processes N)")
    return warnings


def summarize(run: RunResult, slo: Slo) -> dict[str, Any]:
    """The report document (``--json``)."""
    by_step: dict[int, list[RequestResult]] = {}
    for r in run.results:
        by_step.setdefault(r.step, []).append(r)
    everything = list(run.results)
    steps = [summarize_results(by_step.get(step.index, []), step, slo, everything, step is run.steps[-1])
             for step in run.steps]
    span = max((s.start_s + s.duration_s for s in run.steps), default=0.0)
    whole = Step(index=-1, start_s=0.0, duration_s=span)
    overall = summarize_results(everything, whole, slo, everything, last=True)
    overall["offered_qps"] = (sum(s.qps * s.duration_s for s in run.steps if s.qps is not None) / span
                              if span and all(s.qps is not None for s in run.steps) else overall["offered_qps"])
    saturated = saturated_at(steps)
    check = run.self_check
    return {
        "schema_version": SCHEMA_VERSION, "generator": "llmtrace load",
        "url": run.url, "endpoint": run.endpoint, "profile": run.profile, "wall_s": run.wall_s,
        "interrupted": run.interrupted, "tokens_per_word": run.tokens_per_word,
        "slo": {"text": describe(slo), "ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
        "overall": overall, "steps": steps,
        "capacity": capacity(steps, slo), "knee": knee(steps), "saturated_at": saturated,
        "self_check": {"send_lag_p50_s": check.send_lag_p50_s, "send_lag_p99_s": check.send_lag_p99_s,
                       "send_lag_max_s": check.send_lag_max_s, "cpu_s": check.cpu_s, "cpu_share": check.cpu_share,
                       "processes": check.processes},
        "errors": _error_samples(run.results),
        "warnings": [*run.warnings, *self_check_warnings(run)],
    }


def _error_samples(results: tuple[RequestResult, ...], limit: int = 5) -> list[dict[str, Any]]:
    """The distinct error messages, most frequent first (what went wrong, in the server's words)."""
    counts: dict[str, int] = {}
    for r in results:
        if r.error and r.outcome is not Outcome.CHAOS and r.outcome is not Outcome.CANCELLED:
            counts[r.error] = counts.get(r.error, 0) + 1
    return [{"error": e, "count": n} for e, n in sorted(counts.items(), key=lambda kv: -kv[1])[:limit]]


def json_safe(obj: Any) -> Any:
    """NaN/inf become None (the JSON has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj
