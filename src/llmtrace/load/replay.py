"""Replay: arrival times and token lengths from traces operators already have.

No prompt text is read from any of them; prompts are synthesised to the lengths.

* **llmtrace trace files** (or any OTLP/Jaeger source ``llmtrace analyze`` reads): each
  ``llm.request`` span's start and its ``gen_ai.usage.input_tokens``/``output_tokens``.
* **Mooncake / Dynamo JSONL**: one object a line with ``timestamp`` (milliseconds),
  ``input_length``, ``output_length`` and optional ``hash_ids``; requests that share a hash id
  share that prompt block (:data:`MOONCAKE_BLOCK_TOKENS` tokens), so a prefix cache sees the
  reuse the trace had.
* **Azure LLM inference CSV** (2023 and 2024 releases): ``TIMESTAMP,ContextTokens,GeneratedTokens``
  with timestamps like ``2023-11-16 18:15:46.6805900`` or ``2024-05-10 00:00:00.009930+00:00``.

Times are made relative to the first request and divided by ``speed`` (``--speed 2`` replays
twice as fast).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from llmtrace.errors import LLMTraceError
from llmtrace.load.model import PlannedRequest

#: Tokens per ``hash_ids`` block in the Mooncake traces (their README: block size 512).
MOONCAKE_BLOCK_TOKENS = 512
FORMATS = ("auto", "llmtrace", "mooncake", "azure")


class ReplayError(LLMTraceError):
    """A replay file that cannot be read; the message names the file and line."""


def detect_format(path: str) -> str:
    """``mooncake`` for JSONL whose first object has ``input_length``, ``azure`` for CSV, else
    ``llmtrace`` (any trace source the analyzer reads)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head[:2] == b"\x1f\x8b":
        return "llmtrace"  # gzip: only trace files are read compressed
    first = head.decode("utf-8", "replace").lstrip().splitlines()[0] if head.strip() else ""
    if first.startswith("{"):
        return "mooncake" if '"input_length"' in first else "llmtrace"
    if "," in first and not first.startswith("["):
        return "azure"  # a CSV: its header is checked when it is read
    return "llmtrace"


def load_replay(path: str, fmt: str = "auto", speed: float = 1.0) -> list[PlannedRequest]:
    """The planned requests of a replay file, sorted by send time, starting at 0."""
    if not Path(path).is_file():
        raise ReplayError(f"replay file {path} does not exist")
    kind = detect_format(path) if fmt == "auto" else fmt
    reader = {"mooncake": read_mooncake, "azure": read_azure, "llmtrace": read_llmtrace}[kind]
    rows = reader(path)
    if not rows:
        raise ReplayError(f"{path}: no requests in this {kind} file")
    rows.sort(key=lambda row: row[0])
    first = rows[0][0]
    return [PlannedRequest(at_s=(at - first) / speed, input_tokens=max(1, inp), output_tokens=max(1, out),
                           prefix_blocks=blocks) for at, inp, out, blocks in rows]


_Row = tuple[float, int, int, tuple[int, ...]]


def _number(value: object, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ReplayError(f"{where}: {what} must be a non-negative number, got {value!r}")
    return float(value)


def _count(value: object, what: str, where: str) -> int:
    return int(_number(value, what, where))


def read_mooncake(path: str) -> list[_Row]:
    rows: list[_Row] = []
    for number, line in _lines(path):
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReplayError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ReplayError(f"{where}: expected a JSON object")
        missing = [key for key in ("timestamp", "input_length", "output_length") if key not in obj]
        if missing:
            raise ReplayError(f"{where}: missing {', '.join(missing)} (Mooncake format: timestamp, "
                              "input_length, output_length, hash_ids)")
        hash_ids = obj.get("hash_ids") or []
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
            raise ReplayError(f"{where}: hash_ids must be a list of integers")
        at_ms = _number(obj["timestamp"], "timestamp", where)
        rows.append((at_ms / 1000.0, _count(obj["input_length"], "input_length", where),
                     _count(obj["output_length"], "output_length", where), tuple(hash_ids)))
    return rows


#: ``2023-11-16 18:15:46.6805900`` (2023 trace), ``2024-05-10 00:00:00.009930+00:00`` (2024):
#: more fractional digits (.NET ticks) than datetime parses, and an optional UTC offset.
_AZURE_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?")


def _azure_time(text: str, where: str) -> float:
    found = _AZURE_TIME.fullmatch(text.strip())
    if found is None:
        raise ReplayError(f"{where}: TIMESTAMP {text!r} is not a date and time")
    stamp, fraction, offset = found.groups()
    try:
        base = datetime.fromisoformat(stamp + (offset or "+00:00").replace("Z", "+00:00"))
    except ValueError:
        raise ReplayError(f"{where}: TIMESTAMP {text!r} is not a date and time") from None
    return base.timestamp() + (float("0." + fraction) if fraction else 0.0)


def read_azure(path: str) -> list[_Row]:
    rows: list[_Row] = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        needed = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not needed <= set(reader.fieldnames):
            raise ReplayError(f"{path}: header must have TIMESTAMP,ContextTokens,GeneratedTokens "
                              f"(got {','.join(reader.fieldnames or [])})")
        for number, row in enumerate(reader, start=2):
            where = f"{path}:{number}"
            try:
                context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError):
                raise ReplayError(f"{where}: ContextTokens and GeneratedTokens must be integers") from None
            rows.append((_azure_time(row["TIMESTAMP"] or "", where), context, generated, ()))
    return rows


def read_llmtrace(path: str) -> list[_Row]:
    from llmtrace import semconv
    from llmtrace.analysis.sources import load_spans

    try:
        spans = load_spans(path).spans
    except LLMTraceError as exc:
        raise ReplayError(f"{path}: {exc}") from None
    rows: list[_Row] = []
    for span in spans:
        if span.name != semconv.SPAN_REQUEST:
            continue
        inp = span.attributes.get(semconv.GEN_AI_USAGE_INPUT_TOKENS)
        out = span.attributes.get(semconv.GEN_AI_USAGE_OUTPUT_TOKENS) or span.attributes.get(
            semconv.GEN_AI_REQUEST_MAX_TOKENS)
        if isinstance(inp, int) and isinstance(out, int):
            rows.append((span.start_ns / 1e9, inp, out, ()))
    if not rows:
        raise ReplayError(f"{path}: no llm.request spans with gen_ai.usage.input_tokens and output tokens")
    return rows


def _lines(path: str) -> Iterable[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip():
                    yield number, line
    except UnicodeDecodeError:
        raise ReplayError(f"{path}: not UTF-8 text") from None
