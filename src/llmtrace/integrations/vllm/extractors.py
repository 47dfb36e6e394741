"""Pure functions from vLLM objects to immutable records — no OTel, no patching, no GPU.

Each function reads attributes by name and tolerates a missing one (``None`` /
empty), so that the tests can feed it real vLLM objects built on a CPU and
plain stand-ins alike. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from llmtrace import semconv
from llmtrace.integrations._targets import number
from llmtrace.integrations.vllm._constants import CARRIER_KEYS, SUMMARY_KEY

#: vLLM ``FinishReason`` (an IntEnum) -> the reason llmtrace records.
_FINISH_REASONS = {0: semconv.FINISH_STOP, 1: semconv.FINISH_LENGTH, 2: semconv.FINISH_ABORT,
                   3: semconv.FINISH_ERROR, 4: "repetition"}
#: ``RequestOutputKind.DELTA``: the OpenAI server streams with it.
_OUTPUT_KIND_DELTA = 1
#: Summary keys (and their types) accepted from another process; anything else is dropped.
_SUMMARY_FIELDS: dict[str, type] = {"queue_s": float, "prefill_s": float, "decode_s": float,
                                    "decode_stall_s": float, "preemptions": int, "first_step": int,
                                    "last_step": int, "decode_steps": int, "cached_tokens": int,
                                    "transferred_tokens": int, "draft_tokens": int, "accepted_tokens": int}


class RequestParams(NamedTuple):
    """What ``llm.request`` records about a request's sampling parameters (a named tuple: made for
    every request on each side, and a frozen dataclass's per-field ``object.__setattr__`` made it
    the dearest line of reading a request)."""

    request_id: str
    prompt_tokens: int | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stream: bool | None
    lora: str | None = None


@dataclass(frozen=True)
class BatchInfo:
    """One ``SchedulerOutput``: who is in the batch and how many tokens of each kind."""

    request_ids: tuple[str, ...]
    prefill_tokens: int
    decode_tokens: int
    preempted_ids: tuple[str, ...]
    total_tokens: int
    cached_tokens: int = 0  # prompt tokens of the newly admitted requests the prefix cache served


def _length(value: Any) -> int | None:
    try:
        return len(value) if value is not None else None
    except TypeError:
        return None


def request_params(request: Any) -> RequestParams:
    """From an ``EngineCoreRequest`` (API side) or a ``Request`` (engine side)."""
    sampling = getattr(request, "sampling_params", None)
    prompt_tokens = number(getattr(request, "num_prompt_tokens", None), int)
    if prompt_tokens is None:
        prompt_tokens = _length(getattr(request, "prompt_token_ids", None))
    kind = getattr(getattr(sampling, "output_kind", None), "value", None)
    return RequestParams(
        request_id=str(getattr(request, "request_id", "")),
        prompt_tokens=prompt_tokens,
        max_tokens=number(getattr(sampling, "max_tokens", None), int),
        temperature=number(getattr(sampling, "temperature", None), float),
        top_p=number(getattr(sampling, "top_p", None), float),
        stream=None if kind is None else kind == _OUTPUT_KIND_DELTA,
        lora=lora_name(getattr(request, "lora_request", None)),
    )


def lora_name(lora_request: Any) -> str | None:
    """The adapter's name from a ``LoRARequest`` (None for the base model)."""
    name = getattr(lora_request, "lora_name", None) if lora_request is not None else None
    return name if isinstance(name, str) and name else None


def prefill_cache(prefill_stats: Any) -> tuple[int, int] | None:
    """(prefix-cache hits, KV-transfer tokens) from the ``PrefillStats`` vLLM puts on a
    request's first ``EngineCoreOutput``; None when absent or malformed."""
    if prefill_stats is None:
        return None
    local = number(getattr(prefill_stats, "num_local_cached_tokens", None), int)
    external = number(getattr(prefill_stats, "num_external_cached_tokens", None), int)
    if local is None or local < 0:
        return None
    return local, external if external is not None and external >= 0 else 0


def model_name(vllm_config: Any) -> str | None:
    """The served model name (the first one, when vLLM serves it under several)."""
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return str(name) if name else None


def engine_id(vllm_config: Any) -> str:
    """``dp<rank>``: one scheduler per data-parallel rank drives one device group."""
    parallel = getattr(vllm_config, "parallel_config", None)
    rank = number(getattr(parallel, "data_parallel_rank", None), int)
    return f"dp{rank or 0}"


def batch_info(scheduler_output: Any, prompt_lengths: Mapping[str, Any]) -> BatchInfo:
    """Split a step's scheduled tokens into prefill and decode.

    New requests are prefilling; a cached (already running) request is still
    prefilling while its computed tokens are below its prompt length (chunked
    prefill), else decoding. *prompt_lengths* maps a request id to the
    scheduler's ``Request`` (or to a prompt length).
    """
    # Called once per engine step: a tight loop over the batch, no per-request helper calls.
    scheduled: Mapping[str, int] = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    new_reqs = getattr(scheduler_output, "scheduled_new_reqs", None) or ()
    prefill = cached_tokens = 0
    new_ids: set[str] = set()
    for new in new_reqs:
        new_id: str = getattr(new, "req_id", "")
        new_ids.add(new_id)
        prefill += int(scheduled.get(new_id, 0))
        cached_tokens += getattr(new, "num_computed_tokens", 0) or 0
    cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
    decode = 0
    for request_id, done in zip(getattr(cached, "req_ids", None) or (),
                                getattr(cached, "num_computed_tokens", None) or (), strict=False):
        n = scheduled.get(request_id)
        if n is None or request_id in new_ids:
            continue
        entry = prompt_lengths.get(request_id)
        prompt_len = entry if isinstance(entry, int) else getattr(entry, "num_prompt_tokens", None)
        if isinstance(prompt_len, int) and done < prompt_len:
            prefill += min(n, prompt_len - done)
            decode += max(0, n - (prompt_len - done))
        else:
            decode += n
    preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
    total = number(getattr(scheduler_output, "total_num_scheduled_tokens", None), int)
    return BatchInfo(tuple(scheduled), prefill, decode, tuple(sorted(preempted)),
                     total if total is not None else prefill + decode, cached_tokens)


def kv_cache_usage(value: Any) -> float | None:
    """A 0..1 fraction, or None when the engine reports nothing sensible."""
    usage: float | None = number(value, float)
    if usage is None:
        return None
    return min(1.0, max(0.0, usage))


def queue_counts(value: Any) -> tuple[int | None, int | None]:
    """``Scheduler.get_request_counts()`` -> (waiting, running); it returns (running, waiting)."""
    if not isinstance(value, tuple) or len(value) != 2:
        return None, None
    return number(value[1], int), number(value[0], int)


def finish_reason(value: Any) -> str | None:
    """vLLM's ``FinishReason`` (or its int / string) -> ``stop``/``length``/``abort``/``error``/..."""
    if value is None:
        return None
    number = getattr(value, "value", value)
    if isinstance(number, int) and not isinstance(number, bool):
        return _FINISH_REASONS.get(number, str(value).lower())
    return str(value).lower()


def engine_outputs(result: Any) -> list[Any]:
    """Every ``EngineCoreOutput`` in ``update_from_output``'s ``{client: EngineCoreOutputs}``."""
    if not isinstance(result, Mapping):
        return []
    flat: list[Any] = []
    for outputs in result.values():
        flat.extend(getattr(outputs, "outputs", None) or ())
    return flat


def carrier_from(trace_headers: Mapping[str, str] | None) -> dict[str, str] | None:
    """The W3C part of vLLM's ``trace_headers`` (None when it carries no ``traceparent``)."""
    if not trace_headers or not isinstance(trace_headers, Mapping):
        return None
    carrier = {k: str(trace_headers[k]) for k in CARRIER_KEYS if trace_headers.get(k)}
    return carrier if "traceparent" in carrier else None


def merge_carrier(trace_headers: Mapping[str, str] | None, carrier: Mapping[str, str]) -> dict[str, str]:
    """*trace_headers* with its W3C keys replaced by *carrier* (other keys kept)."""
    merged = {k: v for k, v in (trace_headers or {}).items() if k not in CARRIER_KEYS}
    merged.update(carrier)
    return merged


#: The summary on the wire: a format tag, then every field of :data:`_SUMMARY_FIELDS` in that order,
#: each a decimal integer (durations in nanoseconds) or nothing when absent. Not JSON: it is encoded
#: twice per request in EngineCore and decoded twice in the API server, and JSON with floats took
#: about twice as long to encode and a third longer to decode (timeit, docs/perf-log.md).
_WIRE_TAG = "s1"
_WIRE_FIELDS: tuple[tuple[str, bool], ...] = tuple((key, kind is float) for key, kind in _SUMMARY_FIELDS.items())


def encode_summary(summary: Mapping[str, Any]) -> str:
    """Engine durations (seconds) and counts as the compact wire string (only the known keys)."""
    parts = [_WIRE_TAG]
    for key, seconds in _WIRE_FIELDS:
        value = summary.get(key)
        if value is None:
            parts.append("")
        else:
            parts.append(str(round(value * 1e9) if seconds else int(value)))
    return ",".join(parts)


def decode_summary(trace_headers: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The engine summary on an output's ``trace_headers``; None if absent or malformed (negative
    values are dropped)."""
    if not trace_headers or not isinstance(trace_headers, Mapping):
        return None
    raw = trace_headers.get(SUMMARY_KEY)
    if not raw or not isinstance(raw, str):
        return None
    parts = raw.split(",")
    if len(parts) != len(_WIRE_FIELDS) + 1 or parts[0] != _WIRE_TAG:
        return None
    summary: dict[str, Any] = {}
    try:
        for (key, seconds), text in zip(_WIRE_FIELDS, parts[1:], strict=True):
            if text and (value := int(text)) >= 0:
                summary[key] = value / 1e9 if seconds else value
    except ValueError:  # not an integer: not ours
        return None
    return summary


#: What an engine knows at a request's first token.
_FIRST_TOKEN_FIELDS = ("queue_s", "prefill_s", "preemptions", "first_step", "cached_tokens", "transferred_tokens")


def first_token_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an engine summary that is final at the first token."""
    return {k: summary[k] for k in _FIRST_TOKEN_FIELDS if k in summary}


def with_summary(trace_headers: Mapping[str, str] | None, summary: Mapping[str, Any]) -> dict[str, str]:
    """A new ``trace_headers`` dict carrying *summary* (the request's own dict is not mutated)."""
    headers = dict(trace_headers or {})
    headers[SUMMARY_KEY] = encode_summary(summary)
    return headers


def rendered_token_lists(result: Any) -> list[Any]:
    """The ``prompt_token_ids`` lists in a renderer's result.

    ``render_cmpl`` returns a list of engine inputs; ``render_chat`` a pair
    (conversations, engine inputs). Encoder-decoder inputs carry the decoder's.
    """
    inputs = result[1] if isinstance(result, tuple) and len(result) == 2 else result
    found: list[Any] = []
    if not isinstance(inputs, (list, tuple)):
        return found
    for item in inputs:
        if not isinstance(item, Mapping):
            continue
        decoder = item.get("decoder_prompt")
        source = decoder if isinstance(decoder, Mapping) else item
        token_ids = source.get("prompt_token_ids")
        if isinstance(token_ids, list):
            found.append(token_ids)
    return found
