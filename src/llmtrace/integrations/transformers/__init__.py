"""Hugging Face ``transformers``: tokenizers, model forward, ``generate()`` and continuous batching.

What is traced
    * Tokenizers (``PreTrainedTokenizerBase.__call__``, ``encode``, ``decode``,
      ``batch_decode`` — fast and slow tokenizers share these): one record per user
      call, routed like the ``tokenizers`` integration's (which it suppresses
      underneath, so a call is never counted twice).
    * Models: forward hooks on every ``PreTrainedModel`` at ``post_init`` (models
      created before ``instrument()``: use ``llmtrace.instrument_model``); see the
      torch integration for the ``llm.forward`` span.
    * ``GenerationMixin.generate`` -> an ``llm.request`` with prefill (call ->
      first token) and decode (first -> last token), TTFT, TPOT and inter-token
      latencies; or, when a request is already current, its tokens are reported on
      that request. A batched call is one request: ``gen_ai.usage.*`` are sums over
      the sequences (padding excluded), ``gen_ai.response.finish_reasons`` has one
      entry per sequence, ``llm.batch.input_tokens`` / ``llm.batch.output_tokens``
      list them.

    * Continuous batching (``init_continuous_batching``, ``generate_batch``,
      ``transformers serve --continuous-batching``): each manager is an engine
      (``llm.engine.id`` ``hf-cb<n>``) with ``llm.step`` spans (schedule / forward /
      postprocess, the batch and its links), and each ``add_request`` an
      ``llm.request`` with queue / prefill / decode from step membership, a second
      queue after an eviction, and ``abort`` on ``cancel_request``
      (``continuous.py``; transformers 5.20's internals, checked all-or-nothing).

Architecture
    Token timestamps come from the model's forward pre-hook: the start of forward
    *k+1* is when token *k* exists on the host, so no device synchronisation is
    added per step; per-sequence counts are read once from the returned tensor.
    Inside a server call (FastAPI, aiohttp, gRPC integrations) the request's
    arrival is the call's arrival, an earlier prompt encode becomes its
    ``llm.tokenize`` child, and it ends when the response is complete (so a final
    ``decode`` is its ``llm.detokenize`` child). A ``TextStreamer`` (and so
    ``TextIteratorStreamer``) remembers the context it was created in, so
    ``generate()`` run by a plain ``threading.Thread`` joins the handler's trace;
    for other hand-offs run the work in ``contextvars.copy_context().run``.
    Not covered: ``torch.compile``-d generation loops (hooks do not fire; one token
    time at the end), per-step timing of beam search and assisted decoding
    (tokens are timed per forward of the main model).

Attributes
    On ``llm.request``: the GenAI request/usage/latency attributes of
    docs/span-model.md, ``llm.batch.size`` for batched calls. Prompt/completion
    text only with ``capture_content=True`` (the completion when a streamer's
    tokenizer or a final ``decode`` in the server call provides it).

Supported versions
    transformers >= 4.40 (tested with 5.20).
"""

from __future__ import annotations

from llmtrace.integrations.transformers.patch import TransformersInstrumentor

INSTRUMENTOR = TransformersInstrumentor

__all__ = ["INSTRUMENTOR", "TransformersInstrumentor"]
