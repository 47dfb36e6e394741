"""The load report on a terminal: formats the summary document, computes nothing."""

from __future__ import annotations

from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}" if value >= 0.1 else f"{value * 1000:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(summary: dict[str, Any]) -> str:
    o = summary["overall"]
    lines = [f"llmtrace load — {summary['url']}{summary['endpoint']} ({summary['profile']}), "
             f"{o['requests']} requests in {summary['wall_s']:.1f}s"]
    if summary["interrupted"]:
        lines.append(f"  ended early: {summary['interrupted']} — the report covers what was measured")
    lines.append(f"  offered {_num(o['offered_qps'])} req/s, achieved {_num(o['achieved_qps'])} req/s, "
                 f"{_num(o['output_tokens_per_s'], 1)} output tok/s; errors {_pct(o['error_ratio'])}, "
                 f"timeouts {_pct(o['timeout_ratio'])}")
    outcomes = ", ".join(f"{k} {v}" for k, v in o["outcomes"].items())
    chaos = ", ".join(f"{k} {v}" for k, v in o["chaos"].items())
    lines.append(f"  outcomes: {outcomes}" + (f" (chaos clients: {chaos})" if chaos else ""))
    lines.append("")
    lines.append(f"  {'latency (ms)':<14}{'p50':>9}{'p90':>9}{'p99':>9}")
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "e2e")):
        p = o[key]
        lines.append(f"  {name:<14}{_ms(p['p50']):>9}{_ms(p['p90']):>9}{_ms(p['p99']):>9}")
    if len(summary["steps"]) > 1:
        lines += ["", _steps_table(summary)]
    lines.append("")
    lines += _verdicts(summary)
    for error in summary["errors"]:
        lines.append(f"  error x{error['count']}: {error['error']}")
    for warning in summary["warnings"]:
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)


def _steps_table(summary: dict[str, Any]) -> str:
    head = (f"  {'step':<18}{'offered':>8}{'achieved':>9}{'tok/s':>8}{'TTFT p50':>9}{'p99':>7}"
            f"{'TPOT p99':>9}{'e2e p99':>9}{'errors':>8}{'goodput':>8}  SLO")
    rows = [head]
    capacity = (summary["capacity"] or {}).get("step")
    for s in summary["steps"]:
        marks = "capacity" if s["step"] == capacity else ""
        if summary["knee"] and s["step"] == summary["knee"]["step"]:
            marks = (marks + " knee").strip()
        offered = _num(s["offered_qps"], 1) if s["concurrency"] is None else f"c={s['concurrency']}"
        rows.append(f"  {s['label']:<18}{offered:>8}{_num(s['achieved_qps'], 1):>9}"
                    f"{_num(s['output_tokens_per_s'], 0):>8}{_ms(s['ttft_s']['p50']):>9}{_ms(s['ttft_s']['p99']):>7}"
                    f"{_ms(s['tpot_s']['p99']):>9}{_ms(s['e2e_s']['p99']):>9}{_pct(s['error_ratio']):>8}"
                    f"{_pct(s['goodput']):>8}  {marks}")
    return "\n".join(rows)


def _verdicts(summary: dict[str, Any]) -> list[str]:
    lines = []
    slo = summary["slo"]
    if slo["text"] != "none":
        o = summary["overall"]
        lines.append(f"  SLO {slo['text']}: goodput {_pct(o['goodput'])} ({_num(o['goodput_qps'])} req/s)")
        cap = summary["capacity"]
        lines.append(f"  capacity: {cap['label']} ({_num(cap['achieved_qps'])} req/s achieved)" if cap
                     else "  capacity: no step met the SLO at p99")
    knee = summary["knee"]
    if knee:
        lines.append(f"  knee: latency leaves its plateau after {knee['label']} (e2e p50 "
                     f"{_ms(knee['e2e_p50_s'])} ms -> {_ms(knee['next_e2e_p50_s'])} ms at {knee['next_label']})")
    if summary["saturated_at"]:
        lines.append(f"  saturated at {summary['saturated_at']}: answers fell behind requests "
                     "(achieved < 90% of the rate sent)")
    check = summary["self_check"]
    lines.append(f"  client: send lag p50 {_ms(check['send_lag_p50_s'])} ms, p99 {_ms(check['send_lag_p99_s'])} ms; "
                 f"CPU {check['cpu_s']:.1f}s ({check['cpu_share']:.0%} of a core per process, "
                 f"{check['processes']} process{'es' if check['processes'] > 1 else ''})")
    return lines
