"""PyTorch models: ``llm.forward`` spans from forward hooks on chosen models.

What is traced
    Never every ``nn.Module``: hooks go on top-level models only — every
    transformers ``PreTrainedModel`` automatically (see the transformers
    integration) and any model passed to :func:`llmtrace.instrument_model`. A
    forward nested in another traced forward is not timed again. Inside
    ``generate()`` the forwards are not spans: their start times become the
    request's token timestamps (no extra device synchronisation). Outside it, an
    automatically hooked model emits ``llm.forward`` only under a current span or
    request; a model given to ``instrument_model`` always does.

Attributes
    ``llm.model.class``, ``llm.forward.input_shape``, ``llm.forward.dtype``,
    ``llm.forward.device``, ``llm.engine.id`` (when given), and the
    ``llm.torch.memory.*`` allocator numbers when CUDA is already initialised.
    ``instrument_model(model, layers=True)`` adds an ``llm.layer`` child per
    transformer block (the longest ``ModuleList``; else the direct children).

Supported versions
    torch >= 2.2 (tested with 2.14).
"""

from __future__ import annotations

from llmtrace.integrations.torch.patch import TorchInstrumentor, instrument_model, uninstrument_model

INSTRUMENTOR = TorchInstrumentor

__all__ = ["INSTRUMENTOR", "TorchInstrumentor", "instrument_model", "uninstrument_model"]
