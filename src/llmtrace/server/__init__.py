"""The reference server: an OpenAI-compatible API front end and a continuous-batching engine
in its own process, running a tiny random-weight GPT-2 — the shape of vLLM, small enough
for two CPU cores. ``llmtrace demo`` drives it; tests and benchmarks use it as a real server.

Architecture::

    HTTP client --SSE--> FastAPI front end (validate, tokenize, --queue--> engine process
                         llm.request, stop sequences)                  (scheduler, forward,
                         ^                                             llm.engine windows)
                         +------- tokens, finish + durations <--pipe--
                         supervisor: the pipe's end-of-file is the engine's death -> fail open
                         requests, restart the engine (bounded, backed off, counted)

See docs/architecture.md, "The reference server".
"""
