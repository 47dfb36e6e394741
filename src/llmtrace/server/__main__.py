"""``python -m llmtrace.server [--host H] [--port P]``: run the reference server (traced with llmtrace).

An OpenAI-compatible API over a tiny random-weight GPT-2: POST /v1/completions and
/v1/chat/completions (streamed or not; the official openai SDK works against it), GET /v1/models,
/health (200 while the engine serves, 503 with its state otherwise) and /stats. The engine runs
in its own process; if it dies, open requests fail at once and it is restarted (at most 5 times
in 300 s). Spans go where LLMTRACE_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT say (docs/configuration.md).
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m llmtrace.server", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--untraced", action="store_true", help="do not call llmtrace.instrument()")
    args = parser.parse_args()
    import uvicorn

    if not args.untraced:
        import llmtrace

        llmtrace.instrument()
    from llmtrace.server.app import create_app

    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
