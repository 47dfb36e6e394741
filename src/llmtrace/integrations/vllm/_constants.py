"""Targets of the vLLM adapter: every method it hooks, and the parameters it reads by name.

A target whose module, attribute or named parameters differ in the installed
vLLM turns the whole adapter off (one warning naming it): patching half a
pipeline would produce request traces that look complete and are not.
"""

from __future__ import annotations

from typing import Final

from llmtrace.integrations._targets import Target

DISTRIBUTION: Final = "vllm"
TRIGGER: Final = "vllm"
#: The range the targets below were written against (pyproject's ``vllm`` extra says the same).
SUPPORTED: Final = ">=0.30,<0.34"
SUPPORTED_MIN: Final = (0, 30)
SUPPORTED_MAX_EXCLUSIVE: Final = (0, 34)

#: ``LLMTRACE_VLLM=1`` turns the ``vllm.general_plugins`` entry point on (it is a no-op otherwise).
PLUGIN_ENV: Final = "LLMTRACE_VLLM"

#: Key added to ``EngineCoreOutput.trace_headers`` of a request's first and final outputs: the
#: engine's phase durations (``extractors.encode_summary``), read back by the API server. W3C
#: propagators ignore unknown keys.
SUMMARY_KEY: Final = "llmtrace-engine-summary"
#: Key the API server adds to an unsampled request's ``trace_headers`` when vLLM's own request
#: events reach it (``log_stats``, on in ``vllm serve``): it takes that request's queue time and
#: prompt cache from them, and EngineCore keeps no record of the request.
NO_ENGINE_RECORD_KEY: Final = "llmtrace-no-engine-record"
#: vLLM's ``EngineCoreEventType`` values (an ``IntEnum``; tests/vllm/test_extractors.py checks them).
EVENT_QUEUED: Final = 1
EVENT_SCHEDULED: Final = 2
EVENT_PREEMPTED: Final = 3
#: The W3C keys llmtrace writes into ``EngineCoreRequest.trace_headers``.
CARRIER_KEYS: Final = ("traceparent", "tracestate")

#: Scheduler outputs awaiting ``update_from_output`` (async scheduling keeps at most a few
#: in flight); beyond this the oldest are dropped so a lost output can never grow memory.
MAX_PENDING_STEPS: Final = 64
#: API-side request records; beyond this the oldest are aborted (a leak guard, not a limit
#: a healthy server reaches: vLLM's own ``max_num_seqs`` is far lower per engine).
MAX_OPEN_REQUESTS: Final = 100_000
#: Renders remembered until their request is added (a render whose request never comes is evicted).
MAX_RENDERS: Final = 4096
#: An ``arrival_time`` further in the past than this is not trusted as the request's start.
MAX_ARRIVAL_AGE_NS: Final = 600_000_000_000


SCHEDULER_MODULE: Final = "vllm.v1.core.sched.scheduler"
OUTPUT_PROCESSOR_MODULE: Final = "vllm.v1.engine.output_processor"
RENDERER_MODULE: Final = "vllm.renderers.base"
EXECUTOR_MODULE: Final = "vllm.v1.executor.abstract"
UNIPROC_MODULE: Final = "vllm.v1.executor.uniproc_executor"
MULTIPROC_MODULE: Final = "vllm.v1.executor.multiproc_executor"

TARGETS: Final = (
    # API-server process: request records, tokenize, tokens as they reach the server.
    Target(RENDERER_MODULE, "BaseRenderer.render_cmpl", ("prompts",), "api"),
    Target(RENDERER_MODULE, "BaseRenderer.render_cmpl_async", ("prompts",), "api"),
    Target(RENDERER_MODULE, "BaseRenderer.render_chat", ("conversations",), "api"),
    Target(RENDERER_MODULE, "BaseRenderer.render_chat_async", ("conversations",), "api"),
    Target(OUTPUT_PROCESSOR_MODULE, "OutputProcessor.add_request", ("request", "prompt"), "api"),
    Target(OUTPUT_PROCESSOR_MODULE, "OutputProcessor.process_outputs", ("engine_core_outputs",), "api"),
    Target(OUTPUT_PROCESSOR_MODULE, "OutputProcessor.abort_requests", ("request_ids", "internal"), "api"),
    Target(OUTPUT_PROCESSOR_MODULE, "OutputProcessor.propagate_error", ("e",), "api"),
    # EngineCore process: the step timeline and the engine half of each request.
    Target(SCHEDULER_MODULE, "Scheduler.add_request", ("request",), "engine"),
    Target(SCHEDULER_MODULE, "Scheduler.schedule", (), "engine"),
    Target(SCHEDULER_MODULE, "Scheduler.update_from_output", ("scheduler_output", "model_runner_output"),
           "engine"),
    Target(SCHEDULER_MODULE, "Scheduler.finish_requests", ("request_ids", "finished_status"), "engine"),
    Target(SCHEDULER_MODULE, "Scheduler.get_request_counts", (), "engine"),
    Target(SCHEDULER_MODULE, "Scheduler.get_kv_cache_usage", (), "engine"),
    Target(SCHEDULER_MODULE, "Scheduler.has_requests", (), "engine"),
    Target(EXECUTOR_MODULE, "Executor.execute_model", ("scheduler_output",), "engine"),
    Target(UNIPROC_MODULE, "UniProcExecutor.execute_model", ("scheduler_output",), "engine"),
    Target(MULTIPROC_MODULE, "MultiprocExecutor.execute_model", ("scheduler_output",), "engine"),
)

#: Targets that are checked but called, not hooked (the hooks read through them).
CHECK_ONLY: Final = frozenset({"Scheduler.get_request_counts", "Scheduler.get_kv_cache_usage",
                               "Scheduler.has_requests"})
