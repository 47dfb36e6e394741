"""Pure functions from a forward call's arguments to span attributes; no OTel, no hooks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtrace import semconv
from llmtrace.integrations.torch._constants import INPUT_KWARGS


@dataclass(frozen=True)
class ForwardInputs:
    """The main input of a forward call."""

    shape: tuple[int, ...] | None
    dtype: str | None
    device: str | None


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "device")


def main_input(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The first tensor among the well-known input keywords, else the first tensor argument."""
    for name in INPUT_KWARGS:
        value = kwargs.get(name)
        if value is not None and _is_tensor(value):
            return value
    for value in args:
        if _is_tensor(value):
            return value
    return None


def forward_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> ForwardInputs:
    tensor = main_input(args, kwargs)
    if tensor is None:
        return ForwardInputs(None, None, None)
    return ForwardInputs(tuple(int(n) for n in tensor.shape), str(tensor.dtype).removeprefix("torch."),
                         str(tensor.device))


def forward_attributes(model_class: str, inputs: ForwardInputs, engine_id: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {semconv.LLM_MODEL_CLASS: model_class}
    if inputs.shape is not None:
        attrs[semconv.LLM_FORWARD_BATCH_SHAPE] = list(inputs.shape)
    if inputs.dtype is not None:
        attrs[semconv.LLM_FORWARD_DTYPE] = inputs.dtype
    if inputs.device is not None:
        attrs[semconv.LLM_FORWARD_DEVICE] = inputs.device
    if engine_id is not None:
        attrs[semconv.LLM_ENGINE_ID] = engine_id
    return attrs


def layer_modules(model: Any) -> list[tuple[str, Any]]:
    """The modules that deserve an ``llm.layer`` span: the longest ``ModuleList`` (the
    transformer blocks) when there is one, else the direct children."""
    best: tuple[str, Any] | None = None
    for name, module in model.named_modules():
        if type(module).__name__ == "ModuleList" and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is not None and len(best[1]) > 0:
        prefix = best[0]
        return [(f"{prefix}.{index}", child) for index, child in enumerate(best[1])]
    return list(model.named_children())


def memory_attributes(torch_module: Any) -> dict[str, Any]:
    """Allocator statistics, only when CUDA is already initialised (never initialises it)."""
    cuda = getattr(torch_module, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    return {
        semconv.LLM_TORCH_MEMORY_ALLOCATED: int(cuda.memory_allocated()),
        semconv.LLM_TORCH_MEMORY_RESERVED: int(cuda.memory_reserved()),
        semconv.LLM_TORCH_MEMORY_PEAK: int(cuda.max_memory_allocated()),
    }
