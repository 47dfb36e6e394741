"""``llmtrace load``: load an OpenAI-compatible server with every request traced.

Modules, by job:

* :mod:`~llmtrace.load.model` — planned requests, measured results, steps, SLOs (frozen data);
* :mod:`~llmtrace.load.arrivals` — profiles: open-loop schedules, closed-loop steps, lengths, chaos;
* :mod:`~llmtrace.load.replay` — schedules from llmtrace traces, Mooncake JSONL, Azure CSV;
* :mod:`~llmtrace.load.prompts` — synthetic prompts sized against the server's tokenizer;
* :mod:`~llmtrace.load.client` — one request over HTTP (SSE and not), measured;
* :mod:`~llmtrace.load.telemetry` — its CLIENT span and ``gen_ai.client.operation.duration``;
* :mod:`~llmtrace.load.runner` — preflight, the open/closed-loop drivers, worker processes;
* :mod:`~llmtrace.load.report`, :mod:`~llmtrace.load.terminal`, :mod:`~llmtrace.load.html` —
  the summary (goodput, capacity, knee) and its renderings;
* :mod:`~llmtrace.load.slo`, :mod:`~llmtrace.load.alerts` — one SLO definition for the report
  and for Prometheus alert rules.

The command line is :mod:`llmtrace.cli._load`; docs/load.md is the user's page.
"""
