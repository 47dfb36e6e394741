"""The terminal report: what an engineer reads first after ``llmtrace analyze``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

_BAR = 24


def fmt_s(x: float | None) -> str:
    """Seconds, human-scaled: 412 µs, 11.7 ms, 1.27 s."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    ax = abs(x)
    if ax == 0:
        return "0"
    if ax < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if ax < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.3g} s"


def _bar(share: float) -> str:
    n = max(0, min(_BAR, round(share * _BAR)))
    return "█" * n + "·" * (_BAR - n)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def render(summary: Mapping[str, Any], *, max_anomalies: int = 5) -> str:
    """Render a :func:`~llmtrace.analysis.summary.to_json` summary as text."""
    lines: list[str] = []
    src, req = summary["source"], summary["requests"]
    lines.append(f"llmtrace analysis — {src['name']}")
    lines.append(
        f"  {src['spans']:,} spans · {src['traces']:,} traces · {req['count']:,} requests "
        f"({req['errors']} errors) · {fmt_s(req['duration_s'])} · {req['throughput_rps']:.1f} req/s · "
        f"{req['output_tokens_per_s']:.0f} output tok/s"
    )
    if req["count"]:
        lines += ["", f"{'Latency':<22}{'p50':>10}{'p90':>10}{'p99':>10}"]
        for key, label in (("ttft_s", "time to first token"), ("e2e_s", "end to end"), ("tpot_s", "per output token")):
            d = req.get(key) or {}
            lines.append(f"  {label:<20}{fmt_s(d.get('p50')):>10}{fmt_s(d.get('p90')):>10}{fmt_s(d.get('p99')):>10}")
        lines += _phases(summary["breakdown"])
        lines += _critical_path(summary["critical_path"])
    else:
        lines += ["", "Requests: no llm.request spans (latency, phases and critical path need request traces)"]
    lines += _prefix_cache(summary.get("prefix_cache"))
    lines += _gpu_idle(summary["gpu_idle"])
    lines += _bottleneck(summary["bottleneck"])
    lines += _anomalies(summary["anomalies"], max_anomalies)
    if summary.get("client"):
        lines += _client(summary["client"])
    if src["warnings"]:
        lines += ["", "Warnings"] + [f"  ! {w}" for w in src["warnings"]]
    return "\n".join(lines)


def _client(client: Mapping[str, Any]) -> list[str]:
    """The load client's view joined to the server's (analysis/client_join.py)."""
    d = client.get("ttft_delta_s") or {}
    out = ["", f"Client vs server ({client['requests']} requests sent by a load client)",
           f"  client TTFT - server TTFT (network, front end): p50 {fmt_s(d.get('p50'))}, "
           f"p99 {fmt_s(d.get('p99'))}"]
    if client.get("pool_wait_s"):
        w = client["pool_wait_s"]
        out.append(f"  waiting for the client's own connection pool (not the server): p50 {fmt_s(w.get('p50'))}, "
                   f"p99 {fmt_s(w.get('p99'))}")
    if len(client["steps"]) > 1:
        out.append(f"  {'load step':<18}{'client TTFT p50':>16}{'server p50':>12}{'queue':>8}{'decode':>8}  bottleneck")
        for s in client["steps"]:
            c, srv, b = s.get("client_ttft_s") or {}, s.get("server_ttft_s") or {}, s["breakdown"]
            out.append(f"  {s['label']!s:<18}{fmt_s(c.get('p50')):>16}{fmt_s(srv.get('p50')):>12}"
                       f"{_pct(b.get('queue')):>8}{_pct(b.get('decode')):>8}  {s['bottleneck'] or '-'}")
    return out


def _row(d: Mapping[str, Any]) -> str:
    return f"{fmt_s(d['p50_s']):>10}{fmt_s(d['p99_s']):>10}{_pct(d['share']):>8}  {_bar(d['share'])}"


def _phases(breakdown: Mapping[str, Any]) -> list[str]:
    out = ["", f"{'Phase breakdown':<22}{'p50':>10}{'p99':>10}{'share':>8}  of request latency"]
    for phase, d in breakdown.items():
        if not d["share"] and not d["p99_s"]:
            continue
        out.append(f"  {phase:<20}{_row(d)}")
    return out


def _critical_path(cp: Mapping[str, Any], top: int = 8) -> list[str]:
    out = ["", f"{'Critical path':<22}{'p50':>10}{'p99':>10}{'share':>8}  exclusive time on the path"]
    for name, d in list(cp.items())[:top]:
        label = name if len(name) <= 20 else name[:19] + "…"
        out.append(f"  {label:<20}{_row(d)}")
    return out


def _gpu_idle(idle: Mapping[str, Any]) -> list[str]:
    out = ["", "GPU idle (gaps between forward passes, sampled windows only)"]
    if not idle:
        return [*out, "  no engine timeline in the data (no llm.step / llm.forward spans)"]
    for eid, d in idle.items():
        out.append(
            f"  {eid}: {_pct(d['ratio'])} idle — {fmt_s(d['total_s'])} of {fmt_s(d['covered_s'])} in "
            f"{d['gaps']:,} gaps (p50 {fmt_s(d['gap_p50_s'])}, p99 {fmt_s(d['gap_p99_s'])})"
        )
        upstream = d.get("upstream_s", 0.0)  # absent from summaries saved by older versions
        out.append(
            f"      with work waiting {fmt_s(d['with_work_waiting_s'])}"
            + (f" (engine queue empty, work upstream: {fmt_s(upstream)})" if upstream else "")
            + f" · nothing to do {fmt_s(d['nothing_to_do_s'])}"
        )
        total = d["total_s"] or 1.0
        causes = sorted(((k, v) for k, v in d["by_cause_s"].items() if v), key=lambda kv: -kv[1])
        out.append("      host was in: " + ", ".join(f"{k} {v / total:.0%}" for k, v in causes))
    return out


def _prefix_cache(pc: Mapping[str, Any] | None) -> list[str]:
    if not pc:
        return []
    tokens, ttft = pc["tokens"], pc["ttft_p50_s"]
    return ["", f"Prefix cache: {_pct(pc['hit_ratio'])} of prompt tokens served from it "
                f"({pc['hit_requests']} of {pc['requests']} requests hit); computed {tokens['computed']:,}, "
                f"cached {tokens['cached']:,}, transferred {tokens['transferred']:,} tokens",
            f"  TTFT p50: {fmt_s(ttft['hit'])} with a hit, {fmt_s(ttft['miss'])} without"]


def _bottleneck(b: Mapping[str, Any]) -> list[str]:
    out = ["", f"Bottleneck: {b['class'].upper()} (score {b['score']:.2f})"]
    out.append("  evidence: " + ", ".join(f"{k}={v:g}" for k, v in b["evidence"].items()))
    out.append(f"  → {b['recommendation']}")
    if b.get("window_classes"):
        out.append("  per window: " + ", ".join(f"{k} {v}" for k, v in sorted(b["window_classes"].items())))
    return out


def _anomalies(anomalies: Sequence[Mapping[str, Any]], top: int) -> list[str]:
    if not anomalies:
        return ["", "Anomalies: none (robust z > 3.5 within input-length buckets)"]
    out = ["", f"Anomalies ({len(anomalies)}; worst {min(top, len(anomalies))} shown)"]
    for a in anomalies[:top]:
        out.append(
            f"  {a['request_id']:<14} {a['metric']:<7}{fmt_s(a['value']):>10} "
            f"vs median {fmt_s(a['median']):>9} (z {a['z']:.1f}, {a['bucket']} tokens) — "
            f"mostly {a['dominant_segment']} {fmt_s(a['dominant_s'])}"
            f"  trace {a['trace_id']}"
        )
    return out


def render_compare(rows: Sequence[Any], base: str, current: str) -> str:
    out = [
        f"llmtrace compare — base {base} vs current {current}",
        "",
        f"  {'metric':<28}{'base':>11}{'current':>11}{'change':>9}{'p':>9}  verdict",
    ]
    for r in rows:
        is_ratio = r.metric.startswith("gpu_idle")
        fmt = (lambda v: f"{v:.1%}") if is_ratio else ((lambda v: f"{v:.3g}") if "throughput" in r.metric else fmt_s)
        change = f"{r.change * 100:+.1f}pt" if is_ratio else f"{r.change:+.1%}"
        p = "-" if r.p_value is None else f"{r.p_value:.3g}"
        verdict = "REGRESSION" if r.regression else "ok"
        note = f" ({r.note})" if r.note and r.note != "absolute points" else ""
        out.append(f"  {r.metric:<28}{fmt(r.base):>11}{fmt(r.current):>11}{change:>9}{p:>9}  {verdict}{note}")
    n = sum(r.regression for r in rows)
    out += ["", f"{n} regression(s)" if n else "no regression"]
    return "\n".join(out)
