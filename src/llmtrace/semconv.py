"""Every span name, attribute key and metric name llmtrace emits — and nowhere else as a literal.

The names are a contract shared by the instrumentation, the collector config
(tail-sampling policies key on them), the Grafana dashboard and the analyzer.
GenAI semantic-convention names are used where they exist; llmtrace's own
names live under ``llm.`` (spans/attributes) and ``llmtrace.`` (metrics).
See docs/span-model.md for the meaning of each.
"""

from __future__ import annotations

from typing import Final

# --------------------------------------------------------------------------- span names
SPAN_REQUEST: Final = "llm.request"
SPAN_TOKENIZE: Final = "llm.tokenize"
SPAN_QUEUE: Final = "llm.queue"
SPAN_PREFILL: Final = "llm.prefill"
SPAN_DECODE: Final = "llm.decode"
SPAN_DETOKENIZE: Final = "llm.detokenize"

SPAN_ENGINE: Final = "llm.engine"
SPAN_STEP: Final = "llm.step"
SPAN_SCHEDULE: Final = "llm.schedule"
SPAN_FORWARD: Final = "llm.forward"
SPAN_SAMPLE: Final = "llm.sample"
SPAN_POSTPROCESS: Final = "llm.postprocess"
SPAN_GC: Final = "llm.gc"

#: A per-layer forward span, only when ``instrument_model(..., layers=True)``.
SPAN_LAYER: Final = "llm.layer"

REQUEST_PHASE_SPANS: Final = (SPAN_TOKENIZE, SPAN_QUEUE, SPAN_PREFILL, SPAN_DECODE, SPAN_DETOKENIZE)
STEP_CHILD_SPANS: Final = (SPAN_SCHEDULE, SPAN_FORWARD, SPAN_SAMPLE, SPAN_POSTPROCESS)

# ------------------------------------------------------------- GenAI semantic conventions
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_SYSTEM: Final = "gen_ai.system"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
#: Prompt tokens the engine did not compute (prefix-cache hits plus KV received from another
#: instance), the GenAI convention's name; llm.prompt_tokens.* split the prompt three ways.
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
LLM_PROMPT_TOKENS_COMPUTED: Final = "llm.prompt_tokens.computed"
LLM_PROMPT_TOKENS_CACHED: Final = "llm.prompt_tokens.cached"
LLM_PROMPT_TOKENS_TRANSFERRED: Final = "llm.prompt_tokens.transferred"
#: Speculative decoding, per request: draft tokens proposed and accepted, and their ratio.
LLM_SPEC_DRAFT_TOKENS: Final = "llm.spec_decode.draft_tokens"
LLM_SPEC_ACCEPTED_TOKENS: Final = "llm.spec_decode.accepted_tokens"
LLM_SPEC_ACCEPTANCE_RATE: Final = "llm.spec_decode.acceptance_rate"
#: The LoRA adapter that served the request (no GenAI convention names one; llm.* is ours).
LLM_REQUEST_LORA: Final = "llm.request.lora"
#: The model that answered, where it differs from the one asked for (the cohort comparison
#: falls back to it when gen_ai.request.model is absent).
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
# vLLM's own tracing (``--otlp-traces-endpoint``, vllm/tracing): one SERVER span per request,
# its phases as latency attributes, the token counts under the older GenAI names.
VLLM_SPAN_REQUEST: Final = "llm_request"
VLLM_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
VLLM_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
VLLM_REQUEST_ID: Final = "gen_ai.request.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_PROMPT: Final = "gen_ai.prompt"  # only with capture_content=True
GEN_AI_COMPLETION: Final = "gen_ai.completion"  # only with capture_content=True

# vLLM-compatible latencies, in seconds.
GEN_AI_LATENCY_TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E: Final = "gen_ai.latency.e2e"
GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"
GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: Final = "gen_ai.latency.time_in_model_decode"

# ------------------------------------------------------------------- llm.request (ours)
LLM_REQUEST_ID: Final = "llm.request.id"
LLM_REQUEST_FINISH_REASON: Final = "llm.request.finish_reason"
LLM_TTFT_S: Final = "llm.ttft_s"
LLM_TPOT_S: Final = "llm.tpot_s"
LLM_ITL_MEAN_S: Final = "llm.itl.mean_s"
LLM_ITL_P50_S: Final = "llm.itl.p50_s"
LLM_ITL_P99_S: Final = "llm.itl.p99_s"
LLM_ITL_MAX_S: Final = "llm.itl.max_s"
LLM_PREEMPTIONS: Final = "llm.preemptions"
LLM_DECODE_STEPS: Final = "llm.decode.steps"
LLM_DECODE_STALL_S: Final = "llm.decode.stall_s"
LLM_DETOKENIZE_TOTAL_S: Final = "llm.detokenize.total_s"
LLM_STEP_FIRST_ID: Final = "llm.step.first_id"
LLM_STEP_LAST_ID: Final = "llm.step.last_id"
LLM_ENERGY_J: Final = "llm.energy_j"
LLM_STREAM: Final = "llm.stream"
LLM_TIME_TO_FIRST_BYTE_S: Final = "llm.http.time_to_first_byte_s"
LLM_QUEUE_INDEX: Final = "llm.queue.index"  # 0 for the first wait, 1 after the first preemption, ...
#: A batched ``generate()`` is one llm.request; these list each sequence's real (unpadded)
#: prompt length and generated tokens (``gen_ai.response.finish_reasons`` has one entry each).
LLM_BATCH_INPUT_TOKENS: Final = "llm.batch.input_tokens"
LLM_BATCH_OUTPUT_TOKENS: Final = "llm.batch.output_tokens"

# Phase spans.
LLM_TOKENIZE_TOKENS: Final = "llm.tokenize.tokens"
LLM_TOKENIZE_BATCH: Final = "llm.tokenize.batch_size"
LLM_TOKENIZER_CLASS: Final = "llm.tokenizer.class"
LLM_DETOKENIZE_TOKENS: Final = "llm.detokenize.tokens"

# ------------------------------------------------------------------- engine timeline
LLM_ENGINE_ID: Final = "llm.engine.id"
LLM_ENGINE_WINDOW_STEPS: Final = "llm.engine.window.steps"
LLM_STEP_ID: Final = "llm.step.id"
LLM_BATCH_SIZE: Final = "llm.batch.size"
LLM_BATCH_PREFILL_TOKENS: Final = "llm.batch.prefill_tokens"
LLM_BATCH_DECODE_TOKENS: Final = "llm.batch.decode_tokens"
LLM_BATCH_REQUEST_IDS: Final = "llm.batch.request_ids"
#: How the engine ran the batch, where it says: ``extend`` (prefill), ``decode``, ``mixed`` (SGLang).
LLM_BATCH_FORWARD_MODE: Final = "llm.batch.forward_mode"
LLM_BATCH_CACHED_TOKENS: Final = "llm.batch.cached_tokens"  # prompt tokens of the step served from the prefix cache
LLM_QUEUE_WAITING: Final = "llm.queue.waiting"
LLM_QUEUE_RUNNING: Final = "llm.queue.running"
LLM_KV_CACHE_USAGE: Final = "llm.kv_cache.usage"
LLM_PREEMPTED: Final = "llm.preempted"
LLM_FORWARD_GPU_TIME_S: Final = "llm.forward.gpu_time_s"
LLM_FORWARD_GPU_START_NS: Final = "llm.forward.gpu_start_ns"
LLM_FORWARD_GPU_END_NS: Final = "llm.forward.gpu_end_ns"
LLM_FORWARD_BATCH_SHAPE: Final = "llm.forward.input_shape"
LLM_FORWARD_DTYPE: Final = "llm.forward.dtype"
LLM_FORWARD_DEVICE: Final = "llm.forward.device"
LLM_MODEL_CLASS: Final = "llm.model.class"
LLM_LAYER_NAME: Final = "llm.layer.name"
LLM_GC_GENERATION: Final = "llm.gc.generation"
LLM_GC_COLLECTED: Final = "llm.gc.collected"

# torch memory on llm.forward (only when torch already initialised CUDA).
LLM_TORCH_MEMORY_ALLOCATED: Final = "llm.torch.memory.allocated"
LLM_TORCH_MEMORY_RESERVED: Final = "llm.torch.memory.reserved"
LLM_TORCH_MEMORY_PEAK: Final = "llm.torch.memory.peak"

# ------------------------------------------------------------------- GPU (hw.gpu.*)
HW_GPU_ID: Final = "hw.gpu.id"  # comma-separated device ids the span ran on
HW_GPU_UTILIZATION: Final = "hw.gpu.utilization"  # 0..1
HW_GPU_MEMORY_UTILIZATION: Final = "hw.gpu.memory.utilization"  # memory-controller busy, 0..1
HW_GPU_MEMORY_USAGE: Final = "hw.gpu.memory.usage"  # bytes
HW_GPU_MEMORY_LIMIT: Final = "hw.gpu.memory.limit"  # bytes
HW_GPU_POWER: Final = "hw.gpu.power"  # watts
HW_GPU_ENERGY: Final = "hw.gpu.energy"  # joules, monotonically increasing counter
HW_GPU_TEMPERATURE: Final = "hw.gpu.temperature"  # celsius
HW_GPU_CLOCK_SM: Final = "hw.gpu.clock.sm"  # MHz
HW_GPU_CLOCK_MEMORY: Final = "hw.gpu.clock.memory"  # MHz
HW_GPU_PCIE_TX: Final = "hw.gpu.pcie.tx"  # bytes/s
HW_GPU_PCIE_RX: Final = "hw.gpu.pcie.rx"  # bytes/s
HW_GPU_THROTTLE_REASONS: Final = "hw.gpu.throttle_reasons"  # bitmask
#: Suffixes appended to a hw.gpu.* key for window aggregates on spans.
AGG_MEAN_SUFFIX: Final = ".mean"
AGG_MAX_SUFFIX: Final = ".max"

# ---- GPU additions (gpu/ owner, issue 5): metric-only health signals and device labels.
HW_GPU_UUID: Final = "hw.gpu.uuid"  # metric attribute: the NVML UUID (GPU-... / MIG-...)
HW_GPU_NAME: Final = "hw.gpu.name"  # metric attribute: the product name, e.g. "NVIDIA H200"
HW_GPU_ECC_UNCORRECTED: Final = "hw.gpu.ecc.uncorrected"  # volatile uncorrected ECC errors, count
HW_GPU_PERFORMANCE_STATE: Final = "hw.gpu.performance_state"  # P-state, 0 (max) .. 15
# ---- end GPU additions
# ------------------------------------------------------------------- resource (OpenTelemetry)
#: The resource attribute naming the process's service: the analyzer's clock domains and
#: per-service views key on it.
SERVICE_NAME: Final = "service.name"

# ------------------------------------------------------------------- HTTP server (stable semconv)
# llmtrace's own SERVER span and HTTP metrics use the stable HTTP semantic conventions,
# the names OpenTelemetry's instrumentations emit with OTEL_SEMCONV_STABILITY_OPT_IN=http.
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_REQUEST_METHOD_ORIGINAL: Final = "http.request.method_original"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
HTTP_ROUTE: Final = "http.route"
URL_PATH: Final = "url.path"
URL_QUERY: Final = "url.query"
URL_SCHEME: Final = "url.scheme"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
CLIENT_ADDRESS: Final = "client.address"
CLIENT_PORT: Final = "client.port"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
ERROR_TYPE: Final = "error.type"
ERROR_TYPE_OTHER: Final = "_OTHER"
METRIC_HTTP_SERVER_DURATION: Final = "http.server.request.duration"
METRIC_HTTP_SERVER_ACTIVE_REQUESTS: Final = "http.server.active_requests"
#: The HTTP semantic conventions' bucket advice for http.server.request.duration (seconds).
HTTP_SERVER_DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# RPC semantic conventions, with the attribute names opentelemetry-instrumentation-grpc emits
# (``rpc.system``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code`` as an int). That
# instrumentation records no metric; the duration is the conventions' current
# ``rpc.server.call.duration`` in seconds (``rpc.server.duration`` in ms is deprecated).
RPC_SYSTEM: Final = "rpc.system"
RPC_SYSTEM_GRPC: Final = "grpc"
RPC_SERVICE: Final = "rpc.service"
RPC_METHOD: Final = "rpc.method"
RPC_GRPC_STATUS_CODE: Final = "rpc.grpc.status_code"
METRIC_RPC_SERVER_DURATION: Final = "rpc.server.call.duration"
#: The conventions give no bucket advice for it: the HTTP duration's (seconds), the same scale.
RPC_SERVER_DURATION_BUCKETS: Final = HTTP_SERVER_DURATION_BUCKETS
#: Response headers that link a response to its trace (W3C Trace Context Level 2, Server Timing).
HEADER_TRACERESPONSE: Final = "traceresponse"
HEADER_SERVER_TIMING: Final = "server-timing"
HEADER_EXPOSE_HEADERS: Final = "access-control-expose-headers"

# ---- load client (`llmtrace load`): one CLIENT span per request it sends, above the server's
# SERVER span (HTTP client + GenAI client conventions, plus where in the load the request was).
LOAD_CLIENT_ROLE: Final = "load-client"  # llmtrace.process.role of the load tool
URL_FULL: Final = "url.full"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
METRIC_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
LLM_CLIENT_TTFT_S: Final = "llm.client.ttft_s"  # send -> first content chunk, seconds
LLM_CLIENT_TPOT_S: Final = "llm.client.tpot_s"  # (last - first chunk) / (output tokens - 1)
LLM_CLIENT_ITL_MEAN_S: Final = "llm.client.itl.mean_s"
LLM_CLIENT_ITL_P50_S: Final = "llm.client.itl.p50_s"
LLM_CLIENT_ITL_P99_S: Final = "llm.client.itl.p99_s"
LLM_CLIENT_ITL_MAX_S: Final = "llm.client.itl.max_s"
LLM_LOAD_RUN_ID: Final = "llm.load.run_id"
LLM_LOAD_PROFILE: Final = "llm.load.profile"  # steady | steps | burst | long-tail | replay
LLM_LOAD_STEP: Final = "llm.load.step"  # index of the load step the request belonged to
LLM_LOAD_STEP_LABEL: Final = "llm.load.step.label"  # "qps=4" / "concurrency=8"
LLM_LOAD_OFFERED_QPS: Final = "llm.load.offered_qps"
LLM_LOAD_CONCURRENCY: Final = "llm.load.concurrency"
LLM_LOAD_SEND_LAG_S: Final = "llm.load.send_lag_s"  # actual send - intended send, seconds
#: Seconds the request waited for a connection of the client's own pool (--max-connections):
#: a queue on the client's side, inside the CLIENT span, before the server saw anything.
LLM_LOAD_POOL_WAIT_S: Final = "llm.load.pool_wait_s"
LLM_LOAD_CHAOS: Final = "llm.load.chaos"  # disconnect | malformed | slow-reader
LLM_LOAD_OUTCOME: Final = "llm.load.outcome"  # ok | http_error | timeout | ... | chaos
LLM_LOAD_REQUESTED_INPUT_TOKENS: Final = "llm.load.requested_input_tokens"
# ---- end load client
# ------------------------------------------------------------------- resource
LLMTRACE_VERSION_ATTR: Final = "llmtrace.version"
LLMTRACE_PROCESS_ROLE: Final = "llmtrace.process.role"  # api-server | engine | worker

# ------------------------------------------------------------------- metrics
METRIC_TTFT: Final = "gen_ai.server.time_to_first_token"
METRIC_TPOT: Final = "gen_ai.server.time_per_output_token"
METRIC_REQUEST_DURATION: Final = "gen_ai.server.request.duration"
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_QUEUE_TIME: Final = "llmtrace.queue.time"
METRIC_PROMPT_TOKENS: Final = "llmtrace.prompt.tokens"  # counter, by LLM_PROMPT_TOKEN_SOURCE
LLM_PROMPT_TOKEN_SOURCE: Final = "llm.prompt_tokens.source"  # computed | cached | transferred
METRIC_BATCH_SIZE: Final = "llmtrace.batch.size"
METRIC_GPU_IDLE_RATIO: Final = "llmtrace.gpu.idle_ratio"
METRIC_GPU_AVAILABLE: Final = "llmtrace.gpu.available"
METRIC_DROPPED_SPANS: Final = "llmtrace.spans.dropped"
METRIC_INSTRUMENTATION_ERRORS: Final = "llmtrace.instrumentation.errors"
METRIC_OVERHEAD_CPU: Final = "llmtrace.overhead.cpu_time"
METRIC_ENGINE_RESTARTS: Final = "llm.engine.restarts"  # counter by llm.engine.id: a supervisor restarted a dead engine
LLMTRACE_WORKER: Final = "llmtrace.worker"  # span_builder | exporter on METRIC_OVERHEAD_CPU
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"  # input | output on METRIC_TOKEN_USAGE

# GenAI semantic-convention bucket advice (seconds).
TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)
TPOT_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)
REQUEST_DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
TOKEN_USAGE_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)

# ------------------------------------------------------------------- values
FINISH_STOP: Final = "stop"
FINISH_LENGTH: Final = "length"
FINISH_ABORT: Final = "abort"
FINISH_ERROR: Final = "error"
