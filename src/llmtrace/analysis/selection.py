"""``--where`` selections of requests: parsed once, resolved against a request set.

Grammar (clauses joined by ``and``)::

    CLAUSE := FIELD OP VALUE
    OP     := > | >= | < | <= | = | !=
    numeric FIELDs: ttft, e2e, queue, tpot (seconds), input_tokens, output_tokens, start
    text FIELDs:    service, model, engine, lora, trace, request, finish   (= and != only)

A numeric VALUE is a number, a duration (``250ms``, ``2s``, ``500us``), or a percentile of
that field over all requests (``p95``): ``ttft>p95`` is the slowest 5% by TTFT. ``start``
takes an offset from the first request's arrival (``+60s``) or Unix seconds: two windows
are ``start<+60s`` and ``start>=+60s``. Examples::

    ttft>p95
    e2e>=2s and service=api
    start>=+30s and start<+60s
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmtrace import semconv as sc
from llmtrace.analysis.errors import AnalysisError
from llmtrace.analysis.model import RequestView
from llmtrace.analysis.stats import percentile


class SelectionError(AnalysisError):
    """A ``--where`` selection cannot be parsed, or selects nothing usable."""


_NUMERIC = ("ttft", "e2e", "queue", "tpot", "input_tokens", "output_tokens", "start")
_TEXT = ("service", "model", "engine", "lora", "trace", "request", "finish")
_DURATIONS = ("ttft", "e2e", "queue", "tpot")
_CLAUSE = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=|!=|=|>|<)\s*(\S.*?)\s*$", re.IGNORECASE)
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_NUMBER = re.compile(r"^([+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?)(us|ms|s|m)?$", re.IGNORECASE)
_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?)$")


@dataclass(frozen=True, slots=True)
class Clause:
    field: str
    op: str
    value: str


@dataclass(frozen=True, slots=True)
class Selection:
    text: str
    clauses: tuple[Clause, ...]


def parse_selection(text: str) -> Selection:
    """Parse ``text``; raise :class:`SelectionError` naming the part that is wrong."""
    if not text.strip():
        raise SelectionError("empty --where selection")
    clauses = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        m = _CLAUSE.match(part)
        if m is None:
            raise SelectionError(f"--where {text!r}: {part!r} is not FIELD OP VALUE (e.g. ttft>p95, service=api)")
        field, op, value = m.groups()
        field = field.lower()
        if field not in _NUMERIC and field not in _TEXT:
            raise SelectionError(f"--where {text!r}: unknown field {field!r} (one of: {', '.join(_NUMERIC + _TEXT)})")
        if field in _TEXT and op not in ("=", "!="):
            raise SelectionError(f"--where {text!r}: {field} is text, compare it with = or !=")
        if field in _NUMERIC:
            _check_number(text, field, value)
        clauses.append(Clause(field, op, value))
    return Selection(text.strip(), tuple(clauses))


def _check_number(text: str, field: str, value: str) -> None:
    if _PERCENTILE.match(value):
        if not 0 <= float(value[1:]) <= 100:
            raise SelectionError(f"--where {text!r}: percentile {value} is outside p0..p100")
        return
    m = _NUMBER.match(value)
    if m is None:
        raise SelectionError(f"--where {text!r}: {value!r} is not a number, a duration (250ms) or a percentile (p95)")
    if m.group(2) and field not in _DURATIONS and field != "start":
        raise SelectionError(f"--where {text!r}: {field} is a count, {value!r} has a unit")
    if value.startswith("+") and field != "start":
        raise SelectionError(f"--where {text!r}: a +offset applies to start only")


def _queue_s(r: RequestView) -> float | None:
    return r.phase_s(sc.SPAN_QUEUE) if sc.SPAN_QUEUE in r.phases else r.num(sc.GEN_AI_LATENCY_TIME_IN_QUEUE)


_NUMBERS: dict[str, Callable[[RequestView], float | int | None]] = {
    "ttft": lambda r: r.ttft_s,
    "e2e": lambda r: r.e2e_s,
    "queue": _queue_s,
    "tpot": lambda r: r.num(sc.LLM_TPOT_S),
    "input_tokens": lambda r: r.input_tokens,
    "output_tokens": lambda r: r.output_tokens,
    "start": lambda r: r.request.start_ns / 1e9,
}
_ATTRIBUTES = {
    "model": (sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_RESPONSE_MODEL),
    "lora": (sc.LLM_REQUEST_LORA,),
    "finish": (sc.LLM_REQUEST_FINISH_REASON,),
}


def _text(field: str, engine_of: Mapping[str, str]) -> Callable[[RequestView], str | None]:
    if field == "engine":  # requests do not carry it: the steps that served them say
        return lambda r: engine_of.get(r.request.span_id)
    if field == "service":
        return lambda r: (r.server or r.request).service
    if field == "trace":
        return lambda r: r.request.trace_id
    if field == "request":
        return lambda r: r.request_id
    keys = _ATTRIBUTES[field]

    def text(r: RequestView) -> str | None:
        for key in keys:
            value = r.request.attributes.get(key)
            if value is not None:
                return str(value)
        return None

    return text


def _threshold(clause: Clause, requests: Sequence[RequestView], get: Callable[[RequestView], object]) -> float:
    value = clause.value
    m = _PERCENTILE.match(value)
    if m is not None:
        values = sorted(v for r in requests if isinstance(v := get(r), int | float))
        if not values:
            raise SelectionError(f"--where: no request has a {clause.field} value to take {value} of")
        return percentile(values, float(m.group(1)), presorted=True)
    num = _NUMBER.match(value)
    assert num is not None  # checked by parse_selection
    x = float(num.group(1)) * _UNITS[(num.group(2) or "s").lower()]
    if clause.field == "start" and value.startswith("+"):
        x += min(r.request.start_ns for r in requests) / 1e9
    return x


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def resolve(
    selection: Selection, requests: Sequence[RequestView], engine_of: Mapping[str, str] | None = None
) -> Callable[[RequestView], bool]:
    """The predicate of ``selection`` over ``requests`` (percentiles taken over them).
    ``engine_of``: request span id -> the engine that served it (``engine=`` clauses).
    A request without the field's value is never selected by a clause on it."""
    engines = engine_of if engine_of is not None else {}
    tests = [
        _text_test(clause, engines) if clause.field in _TEXT else _number_test(clause, requests)
        for clause in selection.clauses
    ]
    return lambda r: all(t(r) for t in tests)


def _text_test(clause: Clause, engine_of: Mapping[str, str]) -> Callable[[RequestView], bool]:
    get, want, equal = _text(clause.field, engine_of), clause.value, clause.op == "="

    def test(r: RequestView) -> bool:
        value = get(r)
        return value is not None and (value == want) == equal

    return test


def _number_test(clause: Clause, requests: Sequence[RequestView]) -> Callable[[RequestView], bool]:
    get, op = _NUMBERS[clause.field], _OPS[clause.op]
    bound = _threshold(clause, requests, get)

    def test(r: RequestView) -> bool:
        value = get(r)
        return value is not None and op(value, bound)

    return test


__all__ = ["Clause", "Selection", "SelectionError", "parse_selection", "resolve"]
