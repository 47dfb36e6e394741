"""vLLM (v1 engine): the full request and engine span model inside a vLLM deployment.

Turn it on in every vLLM process with the bundled plugin::

    LLMTRACE_VLLM=1 LLMTRACE_EXPORTER=otlp LLMTRACE_ENDPOINT=http://collector:4317 \\
        vllm serve MODEL ...

or call ``llmtrace.instrument()`` before building ``LLM`` / ``AsyncLLM`` in your
own process (the plugin then still reaches the EngineCore process, if
``LLMTRACE_VLLM=1`` is exported). See docs/integrations/vllm.md.

What is traced
--------------
*API-server process* (``OutputProcessor`` and the prompt renderer):
``llm.request`` per vLLM request (each of ``n>1`` samples is its own request),
with ``llm.tokenize`` (the prompt render: chat template + tokenizer),
TTFT/TPOT/inter-token latencies as the server saw the tokens, output tokens,
finish reason (``stop``/``length``/``abort``/``error``/``repetition``),
``llm.detokenize.total_s`` (the output processor's share per request), and the
engine's durations (``gen_ai.latency.time_in_queue``,
``…time_in_model_prefill``, ``…time_in_model_decode``, ``llm.preemptions``,
``llm.decode.steps``, ``llm.step.first_id`` / ``llm.step.last_id``).

*EngineCore process* (``Scheduler`` and the model executor): ``llm.queue``,
``llm.prefill``, ``llm.decode`` in the request's trace (after each preemption a
new ``llm.queue``), and the engine timeline: ``llm.engine`` windows of
``llm.step`` spans (``llm.engine.id`` = ``dp<rank>``; batch size, prefill and
decode tokens, request ids, waiting/running counts, KV-cache usage, preempted
count), each with ``llm.schedule``, ``llm.forward`` and ``llm.postprocess``
children and links to the ``llm.request`` spans of its batch. GPU attributes are
added by the GPU sampler of the process (``hw.gpu.*``) when one runs.

Supported versions
------------------
vllm ``>=0.30,<0.34`` (written and tested against 0.33.0). When the hook fires,
every target in :mod:`._constants` is imported and checked (method present, the
parameters the hooks read by name present); any difference, or a version
outside the range, logs one warning naming it and the adapter stays off — it
never patches half the pipeline, and vLLM runs exactly as without llmtrace.

Architecture
------------
vLLM v1 splits a request across processes: the API server renders and
tokenizes the prompt, opens the request in its ``OutputProcessor`` and sends an
``EngineCoreRequest`` over ZMQ to the EngineCore process, which schedules it,
runs the model (in-process, or through worker processes) and streams
``EngineCoreOutput`` batches back. The adapter follows the request:
``OutputProcessor.add_request`` opens ``llm.request`` and writes its W3C context
into the request's own ``trace_headers`` (a field vLLM already serialises; it
is filled whether or not ``--otlp-traces-endpoint`` is set). In EngineCore,
``Scheduler.add_request`` reads it back, so queue/prefill/decode land in the
API server's trace; ``Scheduler.schedule`` opens an ``llm.step`` keyed by the
``SchedulerOutput`` (several steps are in flight under async scheduling), the
executor's ``execute_model`` marks the forward dispatch and
``Scheduler.update_from_output`` closes the step, counts tokens and, for a
finished request, appends the engine's phase *durations* to the final output's
``trace_headers`` (key ``llmtrace-engine-summary``) for the API server to put
on ``llm.request``. Timestamps never cross the process boundary; each side
converts its own monotonic clock. All span objects are built off the hot path
by the span builder.
"""

from __future__ import annotations

from llmtrace.integrations.vllm._plugin import process_role, vllm_plugin

__all__ = ["INSTRUMENTOR", "process_role", "vllm_plugin"]


def __getattr__(name: str) -> object:
    # The registry reads INSTRUMENTOR only after vLLM is imported; keep this module
    # light so that the entry point costs nothing in processes that never enable it.
    if name == "INSTRUMENTOR":
        from llmtrace.integrations.vllm.patch import VllmInstrumentor

        return VllmInstrumentor
    raise AttributeError(name)
