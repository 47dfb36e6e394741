"""``python -m llmtrace.server [--host H] [--port P]``: run the reference server (traced with llmtrace)."""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m llmtrace.server", description=__doc__)
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
