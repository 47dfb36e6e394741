"""Hugging Face ``tokenizers``: ``Tokenizer.encode``/``encode_batch``/``decode``/``decode_batch``.

What is traced
    Each user-level call is timed once (calls nested inside another traced
    tokenizer call — e.g. transformers calling ``encode_batch`` — are not counted
    again). Where the measurement goes depends on the scope it runs in
    (see ``llmtrace.integrations._common``): on the current request (``llm.tokenize``
    under ``llm.request``; decodes add to ``llm.detokenize.total_s``), parked on the
    server call until ``generate()`` opens the request, or as a ``llm.tokenize`` /
    ``llm.detokenize`` span under the current span. Outside any traced work nothing
    is recorded.

Attributes
    ``llm.tokenize.tokens``, ``llm.tokenize.batch_size``, ``llm.detokenize.tokens``,
    ``llm.tokenizer.class``. Prompt text only with ``capture_content=True``.

Supported versions
    tokenizers >= 0.19 (tested with 0.23).
"""

from __future__ import annotations

from llmtrace.integrations.tokenizers.patch import TokenizersInstrumentor

INSTRUMENTOR = TokenizersInstrumentor

__all__ = ["INSTRUMENTOR", "TokenizersInstrumentor"]
