"""The reference server: an OpenAI-compatible API front end and a continuous-batching engine
in its own process, running a tiny random-weight GPT-2 — the shape of vLLM, small enough
for two CPU cores. ``llmtrace demo`` drives it; tests and benchmarks use it as a real server.

Architecture::

    HTTP client --SSE--> FastAPI front end (tokenize, llm.request) --queue--> engine process
                         ^                                                    (scheduler, forward,
                         +---------------- tokens, finish + durations <------  llm.engine windows)
"""
