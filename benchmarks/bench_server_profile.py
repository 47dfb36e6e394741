#!/usr/bin/env python3
"""Where a traced reference server's CPU goes: llmtrace's share, measured by sampling.

The throughput ratio of ``bench_reference_server.py`` swings ±10 % between rounds on a
shared 2-core VM (batch sizes follow the CPU a server gets), far more than the 3 % and
0.5 % budgets. This measures the cost from inside one traced run instead:

* **py-spy** samples both server processes (front end and engine process, every thread)
  while the load runs; a sample is *llmtrace's* when, walking from its innermost frame
  outwards, an llmtrace (not ``llmtrace/server``, the reference server itself) or
  OpenTelemetry frame comes before any frame of the application (torch, FastAPI,
  starlette, uvicorn, the reference server, ...); standard-library frames belong to
  whoever called them. So the OTel ASGI middleware's own work counts, the request
  handler it wraps does not. This catches the hot-path costs on the serving threads that
  the threads' self-measured CPU (``llmtrace.overhead_cpu_s()``) leaves out;
* **per-thread CPU** from ``/proc`` (utime + stime) for the same interval.

The implied throughput ratio of a CPU-bound server is ``1 - share``. Not in it: indirect
costs (more garbage-collector work, cache pressure), which only an A/B run can see.

    pip install py-spy    # a dev tool, not a dependency
    python benchmarks/bench_server_profile.py [--arm full|production] [--requests 192] [--top 15]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import functools
import importlib.util
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_reference_server as ref  # the same servers and load

_TELEMETRY = ("llmtrace", "opentelemetry", "wrapt")
_STDLIB = frozenset(sys.stdlib_module_names) | {"<frozen runpy>", "<string>", "<module>"}


#: Where the llmtrace the servers run lives (this tree, or another on PYTHONPATH for an A/B run).
_SRC = Path(importlib.util.find_spec("llmtrace").origin or "").resolve().parents[1]  # type: ignore[union-attr]
#: Import roots, longest first, so a path is cut at the innermost one (this tree's src/, then
#: site-packages, then the standard library).
_IMPORT_ROOTS = sorted({f"{_SRC}/", *(f"{Path(p).resolve()}/" for p in sys.path if p and Path(p).is_dir())},
                       key=len, reverse=True)
#: Source lines of llmtrace where the innermost *Python* frame is ours but the time is not
#: our work: a GIL hand-off or an empty-queue wait (py-spy counts a thread that is runnable
#: but not on a CPU as active), or a call into the wrapped function (C code, e.g. a Rust
#: tokenizer, has no Python frame of its own).
_WAIT_MARKERS = ("time.sleep(", ".wait(", "_queue.get(")
_CALL_THROUGH_MARKERS = ("wrapped(*args, **kwargs)",)


@functools.cache
def _source_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _source_line(path: str, line: int) -> str:
    lines = _source_lines(path)
    return lines[line - 1] if 0 < line <= len(lines) else ""


def module_path(path: str) -> str:
    """A py-spy ``--full-filenames`` path relative to the import root it was found under:
    ``opentelemetry/instrumentation/asgi/__init__.py``, ``llmtrace/_otel/export.py``, ``json/decoder.py``.

    py-spy's own shortening keeps only the package part of an ``__init__.py`` (``asgi/__init__.py``),
    which would count OpenTelemetry's instrumentations as the application's code."""
    for root in _IMPORT_ROOTS:
        if path.startswith(root):
            return path[len(root):]
    _, marker, rest = path.rpartition("-packages/")  # another environment's site- or dist-packages
    return rest if marker else path


def classify(frame: str) -> str:
    """'ours', 'wait', 'stdlib' or 'app' for one py-spy frame, ``func (/full/path/to/file.py:LINE)``."""
    location = frame.rsplit(" (", 1)[-1].rstrip(")")
    full_path, _, line = location.rpartition(":")
    path = module_path(full_path)
    top = path.split("/", 1)[0].removesuffix(".py")
    if path.startswith("llmtrace/server/"):
        return "app"
    if top in _TELEMETRY:
        text = _source_line(full_path, int(line)) if line.isdigit() else ""
        if any(marker in text for marker in _WAIT_MARKERS):
            return "wait"
        return "app" if any(marker in text for marker in _CALL_THROUGH_MARKERS) else "ours"
    if top in _STDLIB or path.startswith("<frozen"):
        return "stdlib"
    return "app"


def owner(frames: list[str]) -> str:
    """Whose work a sample counted as ours is, from its frames (outermost first, innermost ours
    last): ``otel-instrumentation`` when it runs inside one of OpenTelemetry's instrumentations
    (the ASGI middleware that makes the SERVER span, its metrics) with no llmtrace frame in
    between, else ``llmtrace`` (llmtrace's code and the OTel SDK parts it drives)."""
    for frame in reversed(frames):
        path = module_path(frame.rsplit(" (", 1)[-1].rpartition(":")[0])
        if path.startswith("llmtrace/"):
            return "llmtrace"
        if path.startswith("opentelemetry/instrumentation/"):
            return "otel-instrumentation"
    return "llmtrace"


@dataclasses.dataclass
class Attribution:
    total: int = 0
    waits: int = 0  # samples of llmtrace's threads at a GIL hand-off or queue wait
    per_process: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    ours: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # per process
    owners: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # per (process, owner)
    frames: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # innermost ours


def attribute(raw: Path) -> Attribution:
    """Count a py-spy raw profile's samples: all, per process, and llmtrace's (by owner and frame)."""
    result = Attribution()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        process = "engine" if sum(p.startswith("process ") for p in parts) > 1 else "front end"
        result.total += n
        result.per_process[process] += n
        frames = [p for p in parts if not p.startswith("process ")]
        for index in range(len(frames) - 1, -1, -1):
            frame = frames[index]
            kind = classify(frame)
            if kind == "wait":
                result.waits += n
                break
            if kind == "ours":
                result.ours[process] += n
                result.owners[f"{process}, {owner(frames[:index + 1])}"] += n
                func, _, location = frame.rpartition(" (")
                result.frames[f"{process}: {func} ({module_path(location)}"] += n
                break
            if kind == "app":
                break
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=("full", "production"), default="full")
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=15, help="llmtrace frames to list")
    parser.add_argument("--keep", default="", help="copy the raw profile here")
    parser.add_argument("--reattribute", default="", metavar="RAW",
                        help="only attribute a profile kept with --keep (py-spy --full-filenames) again")
    args = parser.parse_args()
    if args.reattribute:
        report(args, attribute(Path(args.reattribute)))
        return 0
    spy = shutil.which("py-spy")
    if spy is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        server = ref.Server(args.arm, str(Path(tmp) / "traces.jsonl"))
        raw = Path(tmp) / "profile.txt"
        try:
            asyncio.run(ref._load(server.url, args.concurrency, args.concurrency, 4))  # warm-up
            time.sleep(1.5)
            sampler = subprocess.Popen([spy, "record", "--format", "raw", "-o", str(raw), "-r", str(args.rate),
                                        "--subprocesses", "--nonblocking", "--full-filenames",
                                        "-p", str(server.proc.pid)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(2.0)  # py-spy attaches to both processes
            cpu_before = server.cpu()
            started = time.perf_counter()
            tokens = asyncio.run(ref._load(server.url, args.requests, args.concurrency, args.max_tokens))
            elapsed = time.perf_counter() - started
            time.sleep(1.5)  # the last windows close and export, on the server's CPU
            cpu_after = server.cpu()
            sampler.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
            sampler.wait(60)
        finally:
            server.close()
        if not raw.exists():
            print(f"py-spy wrote no profile: {sampler.stderr.read().decode() if sampler.stderr else ''}",
                  file=sys.stderr)
            return 1
        if args.keep:
            shutil.copy(raw, args.keep)
        attributed = attribute(raw)
    cpu = cpu_after[0] - cpu_before[0]
    print(f"{args.arm}: {args.requests} streaming requests x {args.max_tokens} tokens, concurrency "
          f"{args.concurrency}: {tokens} tokens in {elapsed:.1f} s; server CPU {cpu:.1f} s, of it llmtrace's "
          f"threads (self-measured) {(sum(cpu_after[1].values()) - sum(cpu_before[1].values())) / cpu:.2%}")
    report(args, attributed)
    return 0


def report(args: argparse.Namespace, counted: Attribution) -> None:
    total = counted.total or 1
    share = sum(counted.ours.values()) / total
    print(f"py-spy: {counted.total} samples; llmtrace's (innermost non-stdlib frame is llmtrace/OTel): {share:.2%}"
          f"  -> implied throughput ratio {1 - share:.3f}")
    print(f"  not counted: {counted.waits / total:.2%} of samples with llmtrace's threads at a GIL hand-off or an "
          "empty-queue wait (runnable or blocked, not working)")
    for process in sorted(counted.per_process):
        print(f"  {process:<9} {counted.ours[process] / counted.per_process[process]:6.2%} of its "
              f"{counted.per_process[process]} samples")
    print("by owner (share of all samples):")
    for key, n in sorted(counted.owners.items()):
        print(f"  {n / total:6.2%}  {key}")
    print(f"top {args.top} llmtrace frames (share of all samples):")
    for frame, n in counted.frames.most_common(args.top):
        print(f"  {n / total:6.2%}  {frame}")


if __name__ == "__main__":
    sys.exit(main())
