"""The load report as one self-contained HTML page: cards, the step table, and inline SVG plots.

It takes the stylesheet of ``llmtrace analyze``'s report (analysis/report/static/report.css)
and the same rules: no network, a Content-Security-Policy that forbids every external load,
the summary embedded as JSON. The plots are drawn here as SVG (no script needed), from the
summary alone: latency vs offered load, achieved vs offered rate, TTFT and TPOT percentiles
per step, error ratio per step.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

from llmtrace.load.terminal import render

_W, _H, _PAD_L, _PAD_B, _PAD_T, _PAD_R = 460, 240, 56, 34, 14, 14
_COLORS = ("#3b6fd8", "#e5484d", "#27ae60", "#f39c12", "#8e44ad")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>llmtrace load — {title}</title><style>{css}</style></head>
<body><h1>llmtrace load</h1><div class="sub">{subtitle}</div>
<div class="cards">{cards}</div>
<h2>Verdict</h2><div class="verdict"><pre>{verdict}</pre></div>
<h2>Latency vs offered load</h2><div class="row">{latency}</div>
<h2>Per step</h2><div class="row">{per_step}</div>
<h2>Steps</h2>{table}
<script type="application/json" id="llmtrace-load-data">{data}</script>
</body></html>
"""


def _css() -> str:
    return resources.files("llmtrace.analysis.report").joinpath("static/report.css").read_text(encoding="utf-8")


def _load(step: dict[str, Any]) -> float:
    return float(step["concurrency"] if step["concurrency"] is not None else step["offered_qps"] or 0.0)


def line_chart(title: str, x_label: str, y_label: str, series: dict[str, list[tuple[float, float | None]]],
               *, diagonal: bool = False) -> str:
    """An SVG line chart; points with a None value are left out; *diagonal* draws y = x."""
    points = [(x, y) for values in series.values() for x, y in values if y is not None]
    if not points:
        return f'<div><b>{html.escape(title)}</b><div class="empty">no data</div></div>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_max = max(xs) or 1.0
    y_max = max(*ys, x_max if diagonal else 0.0) * 1.1 or 1.0
    plot_w, plot_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def px(x: float) -> float:
        return _PAD_L + (x / x_max) * plot_w

    def py(y: float) -> float:
        return _PAD_T + plot_h - (y / y_max) * plot_h

    parts = [f'<svg width="{_W}" height="{_H}" role="img" aria-label="{html.escape(title)}">']
    for i in range(5):
        y = y_max * i / 4
        parts.append(f'<line class="grid" x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{py(y):.1f}" y2="{py(y):.1f}"/>'
                     f'<text x="{_PAD_L - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    for x in sorted(set(xs)):
        parts.append(f'<text x="{px(x):.1f}" y="{_H - _PAD_B + 14}" text-anchor="middle">{x:g}</text>')
    parts.append(f'<text x="{_PAD_L + plot_w / 2}" y="{_H - 4}" text-anchor="middle">{html.escape(x_label)}</text>'
                 f'<text x="12" y="{_PAD_T + plot_h / 2}" transform="rotate(-90 12 {_PAD_T + plot_h / 2})" '
                 f'text-anchor="middle">{html.escape(y_label)}</text>')
    if diagonal:
        parts.append(f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(x_max):.1f}" y2="{py(x_max):.1f}" '
                     'stroke="#b8bec9" stroke-dasharray="4 3"/>')
    for color, (name, values) in zip(_COLORS * 3, series.items(), strict=False):
        shown = [(x, y) for x, y in values if y is not None]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in shown)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}">'
                     f"<title>{html.escape(name)}</title></polyline>")
        parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"><title>{html.escape(name)} '
                  f"at {x:g}: {y:.4g}</title></circle>" for x, y in shown]
    parts.append("</svg>")
    legend = "".join(f'<span style="--c: {c}">{html.escape(n)}</span>' for c, n in zip(_COLORS * 3, series,
                                                                                          strict=False))
    return f'<div><b>{html.escape(title)}</b><div class="legend">{legend}</div>{"".join(parts)}</div>'


def _ms_series(steps: list[dict[str, Any]], key: str, quantiles: tuple[str, ...],
               name: str) -> dict[str, list[tuple[float, float | None]]]:
    return {f"{name} {q}": [(_load(s), None if s[key][q] is None else s[key][q] * 1000) for s in steps]
            for q in quantiles}


def _charts(summary: dict[str, Any]) -> tuple[str, str]:
    steps = sorted(summary["steps"], key=_load)
    closed = any(s["concurrency"] is not None for s in steps)
    x_label = "concurrency (clients)" if closed else "offered load (req/s)"
    latency = line_chart("TTFT and e2e vs load", x_label, "ms", {
        **_ms_series(steps, "ttft_s", ("p50", "p99"), "TTFT"), **_ms_series(steps, "e2e_s", ("p50", "p99"), "e2e")})
    rate = line_chart("Achieved vs offered", x_label, "req/s", {
        "achieved": [(_load(s), s["achieved_qps"]) for s in steps],
        "goodput": [(_load(s), s["goodput_qps"]) for s in steps]}, diagonal=not closed)
    ttft = line_chart("TTFT per step", x_label, "ms", _ms_series(steps, "ttft_s", ("p50", "p90", "p99"), "TTFT"))
    tpot = line_chart("TPOT per step", x_label, "ms", _ms_series(steps, "tpot_s", ("p50", "p90", "p99"), "TPOT"))
    errors = line_chart("Error ratio per step", x_label, "%", {
        "errors": [(_load(s), None if s["error_ratio"] is None else s["error_ratio"] * 100) for s in steps],
        "timeouts": [(_load(s), None if s["timeout_ratio"] is None else s["timeout_ratio"] * 100) for s in steps]})
    return latency + rate, ttft + tpot + errors


def _table(summary: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f}"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    head = ("step", "offered", "achieved req/s", "tok/s", "TTFT p50", "TTFT p99", "TPOT p99", "e2e p99", "errors",
            "goodput")
    rows = ["<table><tr>" + "".join(f'<th class="num">{h}</th>' for h in head) + "</tr>"]
    for s in summary["steps"]:
        offered = f"c={s['concurrency']}" if s["concurrency"] is not None else f"{s['offered_qps'] or 0:.2f}"
        cells = (s["label"], offered, f"{s['achieved_qps']:.2f}", f"{s['output_tokens_per_s']:.0f}",
                 ms(s["ttft_s"]["p50"]), ms(s["ttft_s"]["p99"]), ms(s["tpot_s"]["p99"]), ms(s["e2e_s"]["p99"]),
                 pct(s["error_ratio"]), pct(s["goodput"]))
        rows.append("<tr>" + "".join(f'<td class="num">{html.escape(str(c))}</td>' for c in cells) + "</tr>")
    return "".join(rows) + "</table>"


def _cards(summary: dict[str, Any]) -> str:
    o = summary["overall"]
    cap = summary["capacity"]
    items = [("requests", f"{o['requests']:,}"), ("achieved", f"{o['achieved_qps']:.2f} req/s"),
             ("output", f"{o['output_tokens_per_s']:.0f} tok/s"),
             ("errors", "-" if o["error_ratio"] is None else f"{o['error_ratio']:.1%}"),
             ("goodput", "-" if o["goodput"] is None else f"{o['goodput']:.1%}"),
             ("capacity", cap["label"] if cap else "-")]
    return "".join(f'<div class="card"><div class="k">{k}</div><div class="v">{html.escape(v)}</div></div>'
                   for k, v in items)


def render_html(summary: dict[str, Any]) -> str:
    """The page for a summary made by :func:`llmtrace.load.report.summarize`."""
    latency, per_step = _charts(summary)
    subtitle = (f"{summary['url']}{summary['endpoint']} · {summary['profile']} · {summary['wall_s']:.1f}s · "
                f"SLO {summary['slo']['text']}")
    return _PAGE.format(
        title=html.escape(summary["url"]), css=_css(), subtitle=html.escape(subtitle), cards=_cards(summary),
        verdict=html.escape(render(summary)), latency=latency, per_step=per_step, table=_table(summary),
        data=json.dumps(summary, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c"))
