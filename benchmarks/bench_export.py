#!/usr/bin/env python3
"""``llmtrace export --format perfetto`` throughput and memory (target: >= 200k spans/s,
memory bounded independent of input size).

    python benchmarks/bench_export.py                       # 250k and 1M spans
    python benchmarks/bench_export.py --spans 100000 400000 # other sizes
    python benchmarks/bench_export.py --json                # one JSON line per size
    python benchmarks/bench_export.py --instructions        # instructions/span (valgrind)
    python benchmarks/bench_export.py --writer python       # the Python writer (the reference)

Each size is the simulated server of ``llmtrace.analysis.synthetic`` written as OTLP JSON
lines (generated once, cached in the temp dir). Each export runs in a fresh subprocess
(the CLI's ``main(["export", ...])``) so that its peak RSS (``ru_maxrss``) is its own;
throughput is the child's CPU time (``time.process_time``: one core) for read + decode +
write, from after the imports. Bounded memory shows as the same peak RSS at every size.
"args" writes every span attribute into its slice; "no-args" is ``--no-args``. The writer is
the compiled one where llmtrace-native is built (``--writer`` picks one:
``LLMTRACE_EXPORT_WRITER``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _callgrind import instructions_per_thread
from bench_analyzer import dataset  # the same cached span sets

#: Run in the child: the CLI's export, timed from after the imports (interpreter start-up
#: is ~0.35 s of CPU here, a constant that is not throughput), peak RSS of the whole process.
_CHILD = """
import json, resource, sys, time
from llmtrace.cli import main
import llmtrace.cli._export
t = time.process_time()
rc = main(sys.argv[1:])
cpu = time.process_time() - t
print(json.dumps({"rc": rc, "cpu_s": cpu, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run(path: str, out: str, extra: list[str]) -> tuple[float, int]:
    """CPU seconds (read + decode + write, one core) and peak RSS (bytes) of one export,
    in a fresh child process."""
    cmd = [sys.executable, "-c", _CHILD, "export", path, "-o", out, "-q", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    result = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {"rc": done.returncode}
    if result["rc"] != 0:
        raise SystemExit(f"export failed: {cmd}: {done.stderr.strip()}")
    return float(result["cpu_s"]), int(result["maxrss"])


def instructions_per_span(small: int, large: int, extra: list[str]) -> float:
    """Instructions per span under callgrind, from two sizes (start-up cancels out):
    stable where CPU time on a shared VM is not."""
    tmp = tempfile.gettempdir()
    counts = []
    for size in (small, large):
        path, n = dataset(size, tmp)
        out = os.path.join(tmp, "llmtrace-bench-export-cg.json")
        argv = [sys.executable, "-m", "llmtrace.cli", "export", path, "-o", out, "-q", *extra]
        counts.append((n, instructions_per_thread(argv)[1]))
        os.remove(out)
    (n1, i1), (n2, i2) = counts
    return (i2 - i1) / (n2 - n1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, nargs="+", default=[250_000, 1_000_000])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs per size")
    ap.add_argument(
        "--instructions", action="store_true", help="instead: instructions per span under valgrind (10k vs 40k spans)"
    )
    ap.add_argument("--writer", choices=["native", "python"], help="the export's writer (default: native if built)")
    opts = ap.parse_args()
    if opts.writer:
        os.environ["LLMTRACE_EXPORT_WRITER"] = opts.writer  # read by the export in each child
    if opts.instructions:
        for label, extra in (("args", []), ("no-args", ["--no-args"])):
            per_span = instructions_per_span(10_000, 40_000, extra)
            print(
                json.dumps({"mode": label, "instructions_per_span": round(per_span)})
                if opts.json
                else f"{label:<8} {per_span:,.0f} instructions/span"
            )
        return 0
    tmp = tempfile.gettempdir()
    for size in opts.spans:
        path, n = dataset(size, tmp)
        out = os.path.join(tmp, "llmtrace-bench-export.json")
        for label, extra in (("args", []), ("no-args", ["--no-args"])):
            runs = [run(path, out, extra) for _ in range(opts.repeat)]
            cpu = min(r[0] for r in runs)
            rss = min(r[1] for r in runs)
            row = {
                "spans": n,
                "mode": label,
                "cpu_s": round(cpu, 3),
                "spans_per_s": round(n / cpu),
                "peak_rss_mib": round(rss / 2**20, 1),
                "output_mib": round(os.path.getsize(out) / 2**20, 1),
                "input_mib": round(os.path.getsize(path) / 2**20, 1),
            }
            text = (
                f"{n:>9} spans  {label:<8} {row['spans_per_s']:>9,} spans/s  "
                f"peak RSS {row['peak_rss_mib']:>7} MiB  in {row['input_mib']} MiB -> out {row['output_mib']} MiB"
            )
            print(json.dumps(row) if opts.json else text)
        os.remove(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
