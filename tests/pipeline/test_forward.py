"""Model forward: hooks on top-level models only, removable, per-layer spans on request."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace

import llmtrace
from llmtrace import semconv

pytestmark = pytest.mark.torch


def test_pretrained_model_forward_is_one_span_under_the_current_span(capture_spans: Any) -> None:
    """A transformers model created after instrument() is hooked; its inner PreTrainedModel is not timed twice."""
    import torch

    from tests.helpers import tiny_models

    with capture_spans() as captured:
        model = tiny_models.fresh_model()
        with trace.get_tracer("test").start_as_current_span("work"):
            model(input_ids=torch.tensor([[5, 6, 7, 8]]))
        model(input_ids=torch.tensor([[5, 6]]))  # no current span: no root span for an auto-hooked model
    forward = captured.one(semconv.SPAN_FORWARD)
    assert [forward] == captured.children(captured.one("work"))
    assert "GPT2LMHeadModel" == forward.attributes[semconv.LLM_MODEL_CLASS]
    assert (1, 4) == tuple(forward.attributes[semconv.LLM_FORWARD_BATCH_SHAPE])
    assert "int64" == forward.attributes[semconv.LLM_FORWARD_DTYPE]
    assert "cpu" == forward.attributes[semconv.LLM_FORWARD_DEVICE]


def test_instrument_model_traces_any_module_with_layers(capture_spans: Any) -> None:
    """instrument_model(plain nn.Module, layers=True): llm.forward always, one llm.layer per block."""
    import torch

    blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with capture_spans() as captured:
        llmtrace.instrument_model(blocks, layers=True, engine_id="dp0")
        blocks(torch.ones(3, 4))
    forward = captured.one(semconv.SPAN_FORWARD)
    layers = captured.children(forward, semconv.SPAN_LAYER)
    assert ["0", "1", "2"] == [s.attributes[semconv.LLM_LAYER_NAME] for s in layers]
    assert "dp0" == forward.attributes[semconv.LLM_ENGINE_ID]
    assert "float32" == forward.attributes[semconv.LLM_FORWARD_DTYPE]


def test_gpt2_layers_are_the_transformer_blocks(capture_spans: Any) -> None:
    """layers=True on GPT-2 picks the decoder blocks (the longest ModuleList)."""
    import torch

    from tests.helpers import tiny_models

    model = tiny_models.fresh_model(n_layer=3)
    with capture_spans() as captured:
        llmtrace.instrument_model(model, layers=True)
        model(input_ids=torch.tensor([[5, 6, 7]]))
    names = [s.attributes[semconv.LLM_LAYER_NAME] for s in captured.named(semconv.SPAN_LAYER)]
    assert ["transformer.h.0", "transformer.h.1", "transformer.h.2"] == names


def test_uninstrument_removes_every_hook(capture_spans: Any) -> None:
    """After uninstrument() the model has no llmtrace hook left and forwards produce nothing."""
    import torch

    from tests.helpers import tiny_models

    with capture_spans():
        model = tiny_models.fresh_model()
        assert model._forward_pre_hooks
    llmtrace.uninstrument()
    assert {} == dict(model._forward_pre_hooks)
    assert {} == dict(model._forward_hooks)
    assert {} == dict(model.transformer._forward_hooks)
    model(input_ids=torch.tensor([[5, 6]]))


def test_forward_exception_propagates_and_marks_the_span(capture_spans: Any) -> None:
    """A failing forward raises the original exception; llm.forward ends with status ERROR."""
    import torch

    model = torch.nn.Linear(4, 2)
    with capture_spans() as captured:
        llmtrace.instrument_model(model)
        with pytest.raises(RuntimeError, match="shapes"):
            model(torch.ones(3, 5))
    forward = captured.one(semconv.SPAN_FORWARD)
    assert trace.StatusCode.ERROR == forward.status.status_code
    assert "RuntimeError" == forward.status.description
