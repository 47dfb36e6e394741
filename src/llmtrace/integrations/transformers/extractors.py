"""Pure functions from transformers objects to counts and request parameters.

No OTel and no patching here; nothing in this module synchronises a device
except :func:`sequence_outcomes`, which the generate wrapper calls once, after
``generate()`` returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmtrace import semconv


def _numel(value: Any) -> int:
    if hasattr(value, "numel"):
        return int(value.numel())
    if isinstance(value, int):
        return 1
    if isinstance(value, Sequence) and value and isinstance(value[0], Sequence):
        return sum(len(row) for row in value)
    return len(value) if isinstance(value, Sequence) else 0


def _rows(value: Any) -> int:
    if hasattr(value, "shape"):
        return int(value.shape[0]) if len(value.shape) > 1 else 1
    if isinstance(value, Sequence) and value and isinstance(value[0], Sequence):
        return len(value)
    return 1


def encoding_counts(result: Any) -> tuple[int, int]:
    """(real tokens, sequences) of a ``BatchEncoding``: padding is not counted."""
    if type(result) is list:  # encode()'s ids, once per request: without the ABC checks below or a frame
        if result and type(result[0]) is list:  # a batch
            return sum(map(len, result)), len(result)
        return len(result), 1
    if not isinstance(result, Mapping):
        return _numel(result), _rows(result)
    return _mapping_counts(result)


def _mapping_counts(result: Mapping[str, Any]) -> tuple[int, int]:
    mask = result.get("attention_mask")
    ids = result.get("input_ids")
    source = ids if ids is not None else mask
    if source is None:
        return 0, 0
    batch = _rows(source)
    if mask is None:
        return _numel(source), batch
    if hasattr(mask, "sum"):
        return int(mask.sum()), batch
    if mask and isinstance(mask[0], Sequence):
        return sum(sum(row) for row in mask), batch
    return sum(mask), batch


def ids_count(ids: Any) -> int:
    """Number of token ids passed to ``decode`` (an int, a list, a tensor)."""
    return _numel(ids)


@dataclass(frozen=True)
class GenerateParams:
    """The request parameters of one ``generate()`` call."""

    model: str
    max_new_tokens: int | None
    temperature: float | None
    top_p: float | None
    do_sample: bool
    stream: bool


def _config_value(name: str, kwargs: Mapping[str, Any], config: Any) -> Any:
    if name in kwargs and kwargs[name] is not None:
        return kwargs[name]
    return getattr(config, name, None)


def generate_params(model: Any, generation_config: Any, kwargs: Mapping[str, Any], streamer: Any) -> GenerateParams:
    """Parameters as ``generate()`` will see them: keyword overrides, then the generation config."""
    config = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    model_config = getattr(model, "config", None)
    name = getattr(model_config, "name_or_path", "") or type(model).__name__
    do_sample = bool(_config_value("do_sample", kwargs, config))
    max_new = _config_value("max_new_tokens", kwargs, config)
    temperature = _config_value("temperature", kwargs, config) if do_sample else None
    top_p = _config_value("top_p", kwargs, config) if do_sample else None
    return GenerateParams(
        model=str(name),
        max_new_tokens=int(max_new) if max_new is not None else None,
        temperature=float(temperature) if temperature is not None else (0.0 if not do_sample else None),
        top_p=float(top_p) if top_p is not None else None,
        do_sample=do_sample,
        stream=streamer is not None,
    )


def request_attributes(params: GenerateParams, batch: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if batch > 1:
        attrs[semconv.LLM_BATCH_SIZE] = batch
    return attrs


def eos_ids(model: Any, generation_config: Any) -> set[int]:
    config = generation_config if generation_config is not None else getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return set()
    if hasattr(eos, "tolist"):
        eos = eos.tolist()
    return {int(e) for e in eos} if isinstance(eos, (list, tuple)) else {int(eos)}


def prompt_lengths(input_ids: Any, attention_mask: Any) -> list[int]:
    """Real (unpadded) prompt length of each sequence."""
    if attention_mask is not None and hasattr(attention_mask, "sum"):
        return [int(n) for n in attention_mask.sum(-1).reshape(-1).tolist()]
    if input_ids is None or not hasattr(input_ids, "shape"):
        return []
    rows = int(input_ids.shape[0]) if len(input_ids.shape) > 1 else 1
    return [int(input_ids.shape[-1])] * rows


@dataclass(frozen=True)
class SequenceOutcome:
    """How one sequence of a batched generate ended."""

    output_tokens: int
    finish_reason: str


def sequence_outcomes(generated: Sequence[Sequence[int]], eos: set[int],
                      max_new_tokens: int | None) -> list[SequenceOutcome]:
    """Per sequence: tokens up to and including the first eos, and why it stopped."""
    outcomes = []
    for row in generated:
        length = len(row)
        at_limit = max_new_tokens is not None and length >= max_new_tokens
        reason = semconv.FINISH_LENGTH if at_limit else semconv.FINISH_STOP
        for index, token in enumerate(row):
            if token in eos:
                length, reason = index + 1, semconv.FINISH_STOP
                break
        outcomes.append(SequenceOutcome(length, reason))
    return outcomes


def output_sequences(output: Any) -> Any:
    """The token tensor of a ``generate()`` result (a tensor or a ``Generate*Output``)."""
    return getattr(output, "sequences", output)
