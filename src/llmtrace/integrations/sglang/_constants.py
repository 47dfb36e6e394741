"""Targets of the SGLang adapter: every method it hooks, and the parameters it reads by name.

A target whose module, attribute or named parameters differ in the installed SGLang
turns the whole adapter off (one warning naming it): patching half a pipeline would
produce request traces that look complete and are not.
"""

from __future__ import annotations

from typing import Final

from llmtrace.integrations._targets import Target

DISTRIBUTION: Final = "sglang"
TRIGGER: Final = "sglang.srt"
#: The range the targets below were written against (pyproject's ``sglang`` extra says the same).
SUPPORTED: Final = ">=0.5.23,<0.6"
SUPPORTED_MIN: Final = (0, 5, 23)
SUPPORTED_MAX_EXCLUSIVE: Final = (0, 6)

#: ``LLMTRACE_SGLANG=1`` turns the ``sglang.srt.plugins`` entry point on (it is a no-op otherwise).
PLUGIN_ENV: Final = "LLMTRACE_SGLANG"

#: Attribute llmtrace sets on SGLang's per-request time-stats objects, and the key under which
#: their (hooked) ``__getstate__`` carries it across SGLang's ZMQ hops: tokenizer manager ->
#: scheduler (the W3C carrier), scheduler -> detokenizer -> tokenizer manager (the engine's
#: durations and the detokenizer's time). SGLang's ``__setstate__`` restores it as the same
#: attribute; its own tracing state travels beside it, untouched.
CARRY_ATTR: Final = "llmtrace"

#: Batches between ``run_batch`` and ``process_batch_result`` (overlap scheduling keeps one or two
#: in flight); beyond this the oldest are dropped so that a lost result can never grow memory.
MAX_PENDING_STEPS: Final = 64
#: API-side request records; beyond this the oldest are aborted (a leak guard, not a limit a
#: healthy server reaches).
MAX_OPEN_REQUESTS: Final = 100_000

TOKENIZER_MODULE: Final = "sglang.srt.managers.tokenizer_manager"
SCHEDULER_MODULE: Final = "sglang.srt.managers.scheduler"
BATCH_MODULE: Final = "sglang.srt.managers.schedule_batch"
STREAMER_MODULE: Final = "sglang.srt.managers.scheduler_components.output_streamer"
DETOKENIZER_MODULE: Final = "sglang.srt.managers.detokenizer_manager"
TIME_STATS_MODULE: Final = "sglang.srt.observability.req_time_stats"

TARGETS: Final = (
    # HTTP server + TokenizerManager (main process).
    Target(TOKENIZER_MODULE, "TokenizerManager._init_req_state", ("obj",), "api"),
    Target(TOKENIZER_MODULE, "TokenizerManager._tokenize_one_request", ("obj",), "api"),
    Target(TOKENIZER_MODULE, "TokenizerManager._handle_batch_output", ("recv_obj",), "api"),
    Target(TOKENIZER_MODULE, "TokenizerManager.abort_request", ("rid", "abort_all"), "api"),
    Target(TOKENIZER_MODULE, "TokenizerManager._handle_abort_req", ("recv_obj",), "api"),
    # The carrier on SGLang's own per-request message state (every process).
    Target(TIME_STATS_MODULE, "ReqTimeStatsBase.__getstate__", (), "all"),
    Target(TIME_STATS_MODULE, "SchedulerReqTimeStats.__getstate__", (), "all"),
    # Scheduler (one process per DP/TP rank; the model runs in it).
    Target(SCHEDULER_MODULE, "Scheduler.handle_generate_request", ("recv_req",), "scheduler"),
    Target(SCHEDULER_MODULE, "Scheduler.get_next_batch_to_run", (), "scheduler"),
    Target(SCHEDULER_MODULE, "Scheduler.run_batch", ("batch",), "scheduler"),
    Target(SCHEDULER_MODULE, "Scheduler.process_batch_result", ("batch", "result"), "scheduler"),
    Target(SCHEDULER_MODULE, "Scheduler.send_abort_output", ("abort_req", "req"), "scheduler"),
    Target(BATCH_MODULE, "ScheduleBatch.retract_decode", (), "scheduler"),
    Target(STREAMER_MODULE, "SchedulerOutputStreamer.stream_output", ("reqs",), "scheduler"),
    # DetokenizerManager (own process).
    Target(DETOKENIZER_MODULE, "DetokenizerManager.handle_batch_token_id_out", ("recv_obj",), "detokenizer"),
)
