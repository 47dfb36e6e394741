"""Rendering of a :class:`~llmtrace.analysis.cohort.CohortComparison`: terminal text, JSON
document, and a self-contained HTML page. Formatting only; every number comes computed."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from llmtrace.analysis.cohort import CohortComparison, Factor, ShapeDelta

#: Factors shown in the terminal (the JSON and HTML carry all of them).
TERMINAL_FACTORS = 12
SCHEMA = "llmtrace.cohort"
SCHEMA_VERSION = 1


def _lift(f: Factor) -> str:
    return "only here" if f.lift is None else f"{f.lift:.2f}x"


def _shape_cells(d: ShapeDelta) -> tuple[str, str, str, str]:
    return (
        f"{d.selected_per_request:.2f} x {d.selected_mean_s * 1e3:.2f} ms",
        f"{d.other_per_request:.2f} x {d.other_mean_s * 1e3:.2f} ms",
        d.change,
        d.name,
    )


def render_text(c: CohortComparison, source: str) -> str:
    out = [
        f"llmtrace compare — {source}",
        f"  selected: {c.selection}  ({c.selected} requests)",
        f"  against:  {c.other}  ({c.other_count} requests)",
        "",
        "What the selection has in common (most over-represented first)",
        f"  {'feature':<16}{'value':<14}{'selected':>14}{'other':>14}{'effect':>9}{'lift':>11}",
    ]
    for f in c.factors[:TERMINAL_FACTORS]:
        out.append(
            f"  {f.feature:<16}{f.value[:13]:<14}{f'{f.selected} ({f.selected_share:.0%})':>14}"
            f"{f'{f.other} ({f.other_share:.0%})':>14}{f.effect * 100:>+8.0f}pt{_lift(f):>11}"
        )
    if not c.factors:
        out.append("  (no attribute value occurs often enough in the selection to rank)")
    if len(c.factors) > TERMINAL_FACTORS:
        out.append(f"  … {len(c.factors) - TERMINAL_FACTORS} more in --json / --html")
    if c.absent:
        out.append(f"  not in these traces: {', '.join(c.absent)}")
    out += ["", "Structure per request (count x mean length)", f"  {'span':<18}{'selected':>22}{'other':>22}  change"]
    for d in c.structure:
        sel, oth, change, name = _shape_cells(d)
        out.append(f"  {name:<18}{sel:>22}{oth:>22}  {change}")
    return "\n".join(out)


def to_document(c: CohortComparison, source: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "source": source, **asdict(c)}


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def render_html(c: CohortComparison, source: str) -> str:
    factors = [
        (
            f.feature,
            f.value,
            f"{f.selected} ({f.selected_share:.0%})",
            f"{f.other} ({f.other_share:.0%})",
            f"{f.effect * 100:+.0f} pt",
            _lift(f),
        )
        for f in c.factors
    ]
    shape = [(d.name, *_shape_cells(d)[:3]) for d in c.structure]
    absent = f"<p>Not in these traces: {html.escape(', '.join(c.absent))}</p>" if c.absent else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>llmtrace cohort comparison</title>
<style>
body{{font:14px system-ui,sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse;margin:1em 0}}
th,td{{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}} th{{background:#f4f4f4}}
td:nth-child(n+3){{font-variant-numeric:tabular-nums}}
</style></head><body>
<h1>Cohort comparison</h1>
<p>{html.escape(source)}</p>
<p><b>Selected</b>: <code>{html.escape(c.selection)}</code> — {c.selected} requests.
<b>Against</b>: <code>{html.escape(c.other)}</code> — {c.other_count} requests.</p>
<h2>What the selection has in common</h2>
<p>Effect: share among the selected minus share among the others; lift: the ratio of the two.</p>
{_table(("feature", "value", "selected", "other", "effect", "lift"), factors)}
{absent}
<h2>Structure per request</h2>
{_table(("span", "selected (count x mean)", "other (count x mean)", "change"), shape)}
</body></html>
"""


__all__ = ["render_html", "render_text", "to_document"]
