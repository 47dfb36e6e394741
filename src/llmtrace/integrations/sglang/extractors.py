"""Pure functions from SGLang objects to frozen dataclasses — no OTel, no patching, no GPU.

Each function reads attributes by name and tolerates a missing one (``None`` /
empty), so that the tests can feed it real SGLang objects built on a CPU and plain
stand-ins alike. Nothing here imports SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from llmtrace import semconv
from llmtrace.integrations._targets import number
from llmtrace.integrations.sglang._constants import CARRY_ATTR

#: SGLang finish-reason ``type`` -> the reason llmtrace records (``stop`` covers a matched stop
#: token, string or regex).
_FINISH_TYPES = {"length": semconv.FINISH_LENGTH, "stop": semconv.FINISH_STOP, "abort": semconv.FINISH_ABORT}
#: Summary keys (and their types) accepted from another process; anything else is dropped.
_SUMMARY_FIELDS: dict[str, type] = {"queue_s": float, "prefill_s": float, "decode_s": float,
                                    "decode_stall_s": float, "preemptions": int, "first_step": int,
                                    "last_step": int, "decode_steps": int}
#: What an engine knows at a request's first token.
_FIRST_TOKEN_FIELDS = ("queue_s", "prefill_s", "preemptions", "first_step")


@dataclass(frozen=True)
class RequestParams:
    """What ``llm.request`` records about one (sub-)request of a ``GenerateReqInput``."""

    request_id: str
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stream: bool | None


class BatchInfo(NamedTuple):
    """One ``ScheduleBatch``: who is in it, its forward mode and how many tokens of each kind.

    A NamedTuple, not a frozen dataclass: one is built every engine step, and a frozen
    dataclass's ``__init__`` costs ~1 µs more."""

    request_ids: list[str]
    mode: str
    prefill_tokens: int
    decode_tokens: int


@dataclass(frozen=True)
class OutputRow:
    """Request *i* of a ``BatchStrOutput``: cumulative tokens, finish reason, what the engine carried."""

    request_id: str
    completion_tokens: int | None
    cached_tokens: int | None
    prompt_tokens: int | None
    finish_reason: str | None
    carried: Mapping[str, Any] | None




def _item(values: Any, index: int) -> Any:
    if isinstance(values, (list, tuple)) and index < len(values):
        return values[index]
    return None


def request_ids(obj: Any) -> list[str]:
    """The request ids of a normalised ``GenerateReqInput`` (one, or one per prompt/sample)."""
    rid = getattr(obj, "rid", None)
    if isinstance(rid, str):
        return [rid]
    if isinstance(rid, (list, tuple)):
        return [str(r) for r in rid if r]
    return []


def operation(obj: Any) -> str:
    """``gen_ai.operation.name``: ``embeddings`` for an ``EmbeddingReqInput``, else ``text_completion``."""
    return "embeddings" if type(obj).__name__.startswith("Embedding") else "text_completion"


def request_params(obj: Any, index: int = 0) -> RequestParams:
    """Sub-request *index* of a normalised ``GenerateReqInput`` (its sampling params are a dict or a list)."""
    ids = request_ids(obj)
    sampling = getattr(obj, "sampling_params", None)
    if isinstance(sampling, (list, tuple)):
        sampling = _item(sampling, index)
    params = sampling if isinstance(sampling, Mapping) else {}
    stream = getattr(obj, "stream", None)
    return RequestParams(
        request_id=ids[index] if index < len(ids) else "",
        max_tokens=number(params.get("max_new_tokens"), int),
        temperature=number(params.get("temperature"), float),
        top_p=number(params.get("top_p"), float),
        stream=stream if isinstance(stream, bool) else None,
    )


def engine_request(recv_req: Any) -> tuple[str, int | None, RequestParams]:
    """A ``TokenizedGenerateReqInput`` as the scheduler receives it: id, prompt tokens, sampling."""
    sampling = getattr(recv_req, "sampling_params", None)
    input_ids = getattr(recv_req, "input_ids", None)
    try:
        prompt_tokens = len(input_ids) if input_ids is not None else None
    except TypeError:
        prompt_tokens = None
    rid = str(getattr(recv_req, "rid", "") or "")
    stream = getattr(recv_req, "stream", None)
    return rid, prompt_tokens, RequestParams(
        rid, number(getattr(sampling, "max_new_tokens", None), int),
        number(getattr(sampling, "temperature", None), float), number(getattr(sampling, "top_p", None), float),
        stream if isinstance(stream, bool) else None)


def served_model(tokenizer_manager: Any) -> str | None:
    name = getattr(tokenizer_manager, "served_model_name", None)
    if name is None:
        name = getattr(getattr(tokenizer_manager, "server_args", None), "served_model_name", None)
    return str(name) if name else None


def engine_id(dp_rank: Any, tp_rank: Any, tp_size: Any) -> str:
    """``dp<rank>`` for one scheduler per device group; ``dp<rank>-tp<rank>`` when TP splits the group."""
    dp = number(dp_rank, int) or 0
    tp_ranks = number(tp_size, int) or 1
    return f"dp{dp}-tp{number(tp_rank, int) or 0}" if tp_ranks > 1 else f"dp{dp}"


#: Forward modes seen so far -> their names (read once per engine step: a dict hit after the first).
_MODE_NAMES: dict[Any, str] = {}


def forward_mode(batch: Any) -> str:
    """``extend`` (prefill, also chunked), ``decode``, ``mixed`` (prefill chunk + decodes) or ``idle``."""
    mode = getattr(batch, "forward_mode", None)
    try:
        return _MODE_NAMES[mode]
    except (KeyError, TypeError):
        pass
    name = str(getattr(mode, "name", "") or "").lower()
    if not name:
        return "unknown"
    label = name if name in {"decode", "mixed", "idle"} else ("extend" if "extend" in name else name)
    if len(_MODE_NAMES) < 64:  # an enum has a handful of members; never grow without bound
        _MODE_NAMES[mode] = label
    return label


def batch_info(batch: Any) -> BatchInfo:
    """Request ids and the prefill/decode token split of a ``ScheduleBatch`` about to run."""
    # Called once per engine step: one pass over the batch, no per-request helper calls.
    reqs: Sequence[Any] = getattr(batch, "reqs", None) or ()
    ids = [req.rid for req in reqs]
    mode = forward_mode(batch)
    if mode == "decode":
        return BatchInfo(ids, mode, 0, len(ids))
    extend = number(getattr(batch, "extend_num_tokens", None), int)
    if extend is None:
        extend = sum(number(getattr(req, "extend_input_len", 0), int) or 0 for req in reqs)
    decoding = len(getattr(batch, "decoding_reqs", None) or ()) if mode == "mixed" else 0
    return BatchInfo(ids, mode, max(0, extend - decoding), decoding)


def one_token_per_step(batch: Any) -> bool:
    """True unless the batch decodes speculatively (several tokens per request per step)."""
    spec = getattr(batch, "spec_algorithm", None)
    is_none = getattr(spec, "is_none", None)
    return spec is None or (callable(is_none) and bool(is_none()))


def kv_cache_usage(allocator: Any, tree_cache: Any = None) -> float | None:
    """Share of the token-to-KV pool in use (0..1): tokens neither free nor held only by the
    radix cache (an evictable prefix is reusable space, as SGLang's own ``token_usage`` counts it)."""
    # Once per engine step: plain int() conversions, one try block.
    try:
        size = int(allocator.size)
        if size <= 0:
            return None
        free = int(allocator.available_size())
        if tree_cache is not None:
            free += int(tree_cache.evictable_size())
    except Exception:  # noqa: BLE001 - an allocator or cache without these numbers reports nothing
        return None
    usage: float = min(1.0, max(0.0, 1.0 - free / size))
    return usage


def finish_reason(value: Any) -> str | None:
    """SGLang's finish reason (``BaseFinishReason`` or its ``to_json()`` dict) -> stop/length/abort/..."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        to_json = getattr(value, "to_json", None)
        value = to_json() if callable(to_json) else {"type": str(value)}
    kind = str(value.get("type") or "").lower()
    return _FINISH_TYPES.get(kind, kind or semconv.FINISH_STOP)


def carried(time_stats: Any) -> Mapping[str, Any] | None:
    """What llmtrace carried on one of SGLang's per-request time-stats objects, if anything."""
    value = getattr(time_stats, CARRY_ATTR, None) if time_stats is not None else None
    return value if isinstance(value, Mapping) else None


def carry(time_stats: Any, **values: Any) -> None:
    """Add *values* to what travels with this time-stats object (a new dict: never shared)."""
    if time_stats is None:
        return
    merged = dict(carried(time_stats) or {})
    merged.update(values)
    setattr(time_stats, CARRY_ATTR, merged)


def carrier(values: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The W3C carrier in what was carried (None when it holds no ``traceparent``)."""
    raw = values.get("carrier") if values else None
    if not isinstance(raw, Mapping) or not raw.get("traceparent"):
        return None
    return {k: str(v) for k, v in raw.items() if k in ("traceparent", "tracestate") and v}


def summary(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The engine summary in what was carried; None if absent or malformed."""
    raw = values.get("summary") if values else None
    if not isinstance(raw, Mapping):
        return None
    clean: dict[str, Any] = {}
    for key, kind in _SUMMARY_FIELDS.items():
        value = number(raw.get(key), kind)
        if value is not None and value >= 0:
            clean[key] = value
    return clean


def first_token_summary(values: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an engine summary that is final at the first token."""
    return {k: values[k] for k in _FIRST_TOKEN_FIELDS if k in values}


def detokenize_ns(values: Mapping[str, Any] | None) -> int:
    value = number(values.get("detokenize_ns"), int) if values else None
    return value if value is not None and value > 0 else 0


def output_rows(recv_obj: Any) -> list[OutputRow]:
    """Each request of a ``BatchStrOutput`` / ``BatchTokenIDOutput`` as the tokenizer manager got it
    (``time_stats`` already unpickled by SGLang)."""
    rids = getattr(recv_obj, "rids", None) or ()
    reasons = getattr(recv_obj, "finished_reasons", None)
    completion = getattr(recv_obj, "completion_tokens", None)
    cached = getattr(recv_obj, "cached_tokens", None)
    prompt = getattr(recv_obj, "prompt_tokens", None)
    stats = getattr(recv_obj, "time_stats", None)
    rows = []
    for i, rid in enumerate(rids):
        rows.append(OutputRow(str(rid), number(_item(completion, i), int), number(_item(cached, i), int),
                              number(_item(prompt, i), int), finish_reason(_item(reasons, i)),
                              carried(_item(stats, i))))
    return rows
