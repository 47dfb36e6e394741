#!/usr/bin/env python3
"""The llmtrace collector + Jaeger stack without Docker: the shipped configs, Go-built binaries.

    python scripts/stack.py build      # build + cache Jaeger v2 (and the gateway collector, promtool)
    python scripts/stack.py up         # run it until Ctrl-C, on the docker-compose ports
    python scripts/stack.py up --free-ports --keep-all

Binaries are cached in ${LLMTRACE_CACHE:-~/.cache/llmtrace}; a cold build needs Go >= 1.24
and the Go module proxy, and takes several minutes. The pytest fixture ``otel_stack``
(tests/stack/fixtures.py) runs the same code.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.otel_stack.binaries import StackError, build_gateway_collector, build_jaeger, build_promtool
from scripts.otel_stack.stack import STANDARD_PORTS, TEST_SAMPLING, OtelStack


def _build(args: argparse.Namespace) -> int:
    started = time.monotonic()
    print(f"jaeger:  {build_jaeger()}", flush=True)
    if args.gateway:
        print(f"gateway: {build_gateway_collector()}", flush=True)
    print(f"promtool: {build_promtool()}", flush=True)
    print(f"ready in {time.monotonic() - started:.0f}s")
    return 0


def _up(args: argparse.Namespace) -> int:
    stack = OtelStack.start(TEST_SAMPLING if args.keep_all else {},
                            ports=None if args.free_ports else STANDARD_PORTS)
    try:
        print(f"OTLP gRPC   {stack.otlp_grpc_endpoint}    (LLMTRACE_ENDPOINT)")
        print(f"OTLP HTTP   {stack.otlp_http_endpoint}")
        print(f"Jaeger UI   {stack.jaeger_query_url}  (API: /api/v3/traces; UI assets are not in a "
              "Go-module build: use the API or docker compose for the UI)")
        print(f"Prometheus  {stack.prometheus_url}")
        print(f"logs        {stack.log_dir}")
        print("Ctrl-C to stop.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while all(p.proc.poll() is None for p in stack.processes):
            time.sleep(0.5)
        print("a process exited:\n" + stack.logs(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build and cache the binaries")
    build.add_argument("--no-gateway", dest="gateway", action="store_false",
                       help="skip the gateway-tier collector (only the two-tier example needs it)")
    build.set_defaults(func=_build)
    up = sub.add_parser("up", help="run collector + Jaeger in the foreground")
    up.add_argument("--free-ports", action="store_true",
                    help="free loopback ports instead of 4317/4318/16686")
    up.add_argument("--keep-all", action="store_true",
                    help="keep every trace, decide after 2 s (the tests' settings), not the shipped sampling")
    up.set_defaults(func=_up)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except StackError as err:
        print(f"stack: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
