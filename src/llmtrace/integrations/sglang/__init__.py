"""SGLang (``sglang.srt``): the full request and engine span model inside an SGLang deployment.

Turn it on in every SGLang process with the bundled plugin::

    LLMTRACE_SGLANG=1 LLMTRACE_EXPORTER=otlp LLMTRACE_ENDPOINT=http://collector:4317 \\
        python -m sglang.launch_server --model-path MODEL ...

or call ``llmtrace.instrument()`` in your own process before building
``sglang.Engine`` (the plugin then still reaches the scheduler and detokenizer
processes, if ``LLMTRACE_SGLANG=1`` is exported). See docs/integrations/sglang.md.

What is traced
--------------
*HTTP server + TokenizerManager*: ``llm.request`` per SGLang request (each prompt
of a batch and each of ``n>1`` samples is its own) under the SERVER span, with
``llm.tokenize``; TTFT/TPOT/inter-token latencies as the server streamed the tokens;
output tokens; finish reason (``stop``/``length``/``abort``); prefix-cache hits
(``gen_ai.usage.cache_read.input_tokens``, ``llm.prompt_tokens.cached`` /
``.computed``, from SGLang's ``cached_tokens``); ``llm.detokenize.total_s`` (measured
in the DetokenizerManager process); and the scheduler's durations
(``gen_ai.latency.time_in_queue``, ``…time_in_model_prefill``,
``…time_in_model_decode``, ``llm.preemptions``, ``llm.decode.steps``,
``llm.step.first_id`` / ``llm.step.last_id``).

*Scheduler* (one process per DP/TP rank; the model runs in it): ``llm.queue``,
``llm.prefill`` (a chunked prefill is one span over its chunks), ``llm.decode`` in
the request's trace (after each retraction a new ``llm.queue``), and the engine
timeline: ``llm.engine`` windows of ``llm.step`` spans (``llm.engine.id`` =
``dp<rank>``, or ``dp<rank>-tp<rank>`` under tensor parallelism; batch size, forward
mode ``extend``/``decode``/``mixed``, prefill and decode tokens, request ids,
waiting/running counts, KV-pool usage, retracted count), each with ``llm.schedule``,
``llm.forward`` and ``llm.postprocess`` children and links to the ``llm.request``
spans of its batch. GPU attributes are added by the GPU sampler of the process
(``hw.gpu.*``) when one runs; ``llm.forward`` carries CUDA-event GPU time when
torch uses CUDA.

Supported versions
------------------
sglang ``>=0.5.23,<0.6`` (written and tested against 0.5.23). When the hook fires,
every target in :mod:`._constants` is imported and checked (method present, the
parameters the hooks read by name present); any difference, or a version
outside the range, logs one warning naming it and the adapter stays off — it
never patches half the pipeline, and SGLang runs exactly as without llmtrace.

Architecture
------------
SGLang splits a request over three processes connected by ZMQ: the HTTP server's
TokenizerManager tokenizes and sends a ``TokenizedGenerateReqInput`` to the
Scheduler, which batches, runs the model in-process and sends ``BatchTokenIDOutput``
to the DetokenizerManager, which sends ``BatchStrOutput`` back to the
TokenizerManager. Each message carries SGLang's per-request time-stats objects
(pickled with their own ``__getstate__``); the adapter adds one key to that state,
so its values travel whether or not SGLang's own tracing is on: the W3C carrier of
``llm.request`` to the Scheduler (queue/prefill/decode land in the HTTP server's
trace), the engine's phase *durations* and the detokenizer's time back to the HTTP
server. Timestamps never cross a process; each side converts its own monotonic
clock. With ``--enable-trace``, SGLang's request span is rooted under
``llm.request`` (its external trace header is llmtrace's context): one tree per
request. SGLang loads its plugins before it initialises its tracing, so llmtrace's
provider is the global one and SGLang's spans go through it (OpenTelemetry refuses
SGLang's own provider). The data-parallel controller copies each request's time
stats into its own class; a class default on ``ReqTimeStatsBase`` makes the copy
keep the carried values.
Under overlap scheduling the steps overlap (batch N+1 is scheduled and launched
before batch N's result is processed): a step is keyed by its batch, then by its
result, never by "the current step". All span objects are built off the hot path
by the span builder.
"""

from __future__ import annotations

from llmtrace.integrations.sglang._plugin import process_role, sglang_plugin

__all__ = ["INSTRUMENTOR", "process_role", "sglang_plugin"]


def __getattr__(name: str) -> object:
    # The registry reads INSTRUMENTOR only after SGLang is imported; keep this module
    # light so that the entry point costs nothing in processes that never enable it.
    if name == "INSTRUMENTOR":
        from llmtrace.integrations.sglang.patch import SglangInstrumentor

        return SglangInstrumentor
    raise AttributeError(name)
