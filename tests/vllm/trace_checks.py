"""Reads llmtrace's OTLP-JSON-lines output and checks the vLLM span model in it.

Shared by the CPU tests and ``scripts/vllm-gpu-check`` (stdlib only, so the
script can use it from a fresh checkout). :func:`check` returns a list of
problems (empty = the structure is right) and a few counts for the report.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str, dict[str, Any]]]
    role: str
    status: str = ""


def _value(value: dict[str, Any]) -> Any:
    if "arrayValue" in value:
        return [_value(v) for v in value["arrayValue"].get("values", [])]
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    return None


def _attrs(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items or ()}


def load(path: str | Path) -> list[Span]:
    """Every span in an OTLP-JSON-lines file (metric lines are skipped)."""
    spans: list[Span] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        data = json.loads(line)
        for resource_spans in data.get("resourceSpans", []):
            role = str(_attrs(resource_spans.get("resource", {}).get("attributes")).get(
                "llmtrace.process.role", ""))
            for scope in resource_spans.get("scopeSpans", []):
                for raw in scope.get("spans", []):
                    links = [(link.get("traceId", ""), link.get("spanId", ""), _attrs(link.get("attributes")))
                             for link in raw.get("links", [])]
                    spans.append(Span(raw["name"], raw["traceId"], raw["spanId"], raw.get("parentSpanId", ""),
                                      int(raw.get("startTimeUnixNano", 0)), int(raw.get("endTimeUnixNano", 0)),
                                      _attrs(raw.get("attributes")), links, role,
                                      str(raw.get("status", {}).get("code", ""))))
    return spans


def load_metrics(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Each metric's data points (OTLP/JSON) from the last export that had any, of any process in
    the file: the instruments are cumulative, so the last export holds every measurement."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        for resource_metrics in json.loads(line).get("resourceMetrics", []):
            for scope in resource_metrics.get("scopeMetrics", []):
                for metric in scope.get("metrics", []):
                    for kind in ("histogram", "sum", "gauge"):
                        points = metric.get(kind, {}).get("dataPoints")
                        if points:
                            found[metric["name"]] = points
    return found


def point_attributes(point: dict[str, Any]) -> dict[str, Any]:
    """A metric data point's attributes as plain values."""
    return _attrs(point.get("attributes"))


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(spans: list[Span], *, expected_requests: int | None = None, expect_decode: bool = True,
          expect_engine: bool = True, expect_tokenize: bool = True, engine_role: str = "engine") -> Report:
    """The span model of an engine adapter: requests (API server) joined by engine phases (from the
    process whose ``llmtrace.process.role`` is *engine_role*) and linked steps."""
    report = Report()
    problems = report.problems
    by_name: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_name[span.name].append(span)
    requests = by_name["llm.request"]
    report.counts = {name: len(items) for name, items in sorted(by_name.items()) if name.startswith("llm.")}
    if expected_requests is not None and len(requests) != expected_requests:
        problems.append(f"expected {expected_requests} llm.request spans, found {len(requests)}")
    children: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        children[span.parent_id].append(span)
    steps = by_name["llm.step"]
    linked = {(t, s) for step in steps for t, s, _ in step.links}
    step_ids = {step.attributes.get("llm.step.id") for step in steps}
    engine_traced = engine_role in {s.role for s in spans}
    for request in requests:
        problems.extend(_check_request(request, children[request.span_id], linked, step_ids,
                                       engine_role if engine_traced else None,
                                       expect_decode=expect_decode, expect_engine=expect_engine,
                                       expect_tokenize=expect_tokenize))
    if expect_engine:
        problems.extend(_check_steps(steps, children, by_name["llm.engine"]))
    return report


def _check_request(request: Span, kids_list: list[Span], linked: set[tuple[str, str]], step_ids: set[Any],
                   engine_role: str | None, *, expect_decode: bool, expect_engine: bool,
                   expect_tokenize: bool) -> list[str]:
    problems: list[str] = []
    rid = request.attributes.get("llm.request.id")
    kids = {child.name: child for child in kids_list if child.trace_id == request.trace_id}
    wanted = ["llm.queue", "llm.prefill"] if expect_engine else []
    if expect_tokenize:
        wanted.append("llm.tokenize")
    if expect_decode and (request.attributes.get("gen_ai.usage.output_tokens") or 0) > 1:
        wanted.append("llm.decode")
    missing = [name for name in wanted if name not in kids]
    if missing:
        problems.append(f"request {rid}: no {', '.join(missing)} child (has {sorted(kids)})")
    if not expect_engine:
        return problems
    for key in ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill",
                "llm.step.first_id", "gen_ai.latency.time_to_first_token"):
        if key not in request.attributes:
            problems.append(f"request {rid}: attribute {key} missing")
    for key in ("llm.step.first_id", "llm.step.last_id"):
        value = request.attributes.get(key)
        if value is not None and value not in step_ids:
            problems.append(f"request {rid}: {key}={value} is no llm.step.id")
    if (request.trace_id, request.span_id) not in linked:
        problems.append(f"request {rid}: no llm.step links to it")
    if engine_role is not None and not any(kid.role == engine_role for kid in kids_list):
        problems.append(f"request {rid}: no phase span from the engine process")
    return problems


def _check_steps(steps: list[Span], children: dict[str, list[Span]], engines: list[Span]) -> list[str]:
    problems: list[str] = []
    if not steps:
        return ["no llm.step spans"]
    engine_ids = {engine.span_id for engine in engines}
    busy = [step for step in steps if (step.attributes.get("llm.batch.size") or 0) > 0]
    for step in steps:
        if step.parent_id not in engine_ids:
            problems.append(f"llm.step {step.attributes.get('llm.step.id')}: parent is not an llm.engine window")
        if "llm.engine.id" not in step.attributes:
            problems.append(f"llm.step {step.attributes.get('llm.step.id')}: no llm.engine.id")
    for step in busy:
        names = {child.name for child in children[step.span_id]}
        missing = {"llm.schedule", "llm.forward", "llm.postprocess"} - names
        if missing:
            problems.append(f"llm.step {step.attributes.get('llm.step.id')}: no {', '.join(sorted(missing))}")
        if not step.links:
            problems.append(f"llm.step {step.attributes.get('llm.step.id')}: batch of "
                            f"{step.attributes.get('llm.batch.size')} but no links")
        for child in children[step.span_id]:
            if child.name == "llm.forward" and "llm.engine.id" not in child.attributes:
                problems.append("llm.forward without llm.engine.id")
            if child.start_ns < step.start_ns or child.end_ns > step.end_ns:
                problems.append(f"{child.name} of step {step.attributes.get('llm.step.id')} outside its step")
    return problems
