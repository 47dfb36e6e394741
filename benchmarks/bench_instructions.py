#!/usr/bin/env python3
"""Instructions the analyzer executes per stage (parse, build, analyze), counted by valgrind.

    python benchmarks/bench_instructions.py                       # this tree, 100k-span set
    python benchmarks/bench_instructions.py --other OLD_PYTHONPATH  # and another tree: A/B

Wall-clock time on a shared VM drifts by up to 1.6x within an hour (bench_analyzer.py prints
a JSON-decode floor to show it); an instruction count does not, so two trees compare to the
last digit. It is not time (cache misses, page faults and allocator behaviour are not in
it), which is why bench_analyzer.py stays the measure of record and this one explains it.
Each stage is the difference between two runs of one process (imports and the table set-up
are in both): ``Collected`` of callgrind for "read", minus the run that stops before it, and
so on. ``--other`` is a PYTHONPATH holding another llmtrace's ``src`` and its own
``llmtrace_native`` build (e.g. ``/tmp/oldnative:/tmp/oldtree/src``). Needs ``valgrind``;
one run of the 100k set takes about 30 s under it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_analyzer import dataset

STAGES = ("read", "build", "analyze")

# Runs the first `stage` stages with bench_analyzer's own helpers (which also serve trees
# from before the engine table).
_PROGRAM = """
import gc, sys
sys.path.insert(0, sys.argv[3])
from bench_analyzer import _build, _load, new_table
from llmtrace.analysis import analyze
stage, path = int(sys.argv[1]), sys.argv[2]
gc.collect()
table = new_table(True)
if stage >= 1:
    loaded = _load(path, table)
if stage >= 2:
    ts = _build(loaded, table)
if stage >= 3:
    analyze(ts, source=path)
"""


def count(stage: int, path: str, pythonpath: str | None) -> int:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", _PROGRAM,
         str(stage), path, os.path.dirname(os.path.abspath(__file__))],
        env=env, capture_output=True, text=True, check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def stages(path: str, pythonpath: str | None) -> dict[str, int]:
    totals = [count(stage, path, pythonpath) for stage in range(len(STAGES) + 1)]
    return {name: totals[i + 1] - totals[i] for i, name in enumerate(STAGES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100_000, help="approximate span count (default 100k)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the generated set is cached")
    parser.add_argument("--other", metavar="PYTHONPATH", help="also count another tree (A/B)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt install valgrind)")
    path, n = dataset(args.spans, args.dir)
    print(f"dataset {path}: {n:,} spans; instructions per stage (valgrind --tool=callgrind)")
    runs = {"this tree": stages(path, None)}
    if args.other:
        runs["other tree"] = stages(path, args.other)
    for label, per in runs.items():
        cells = "  ".join(f"{s} {per[s] / 1e9:.3f}e9 ({per[s] / n:,.0f}/span)" for s in STAGES)
        print(f"{label:10s}  {cells}  total {sum(per.values()) / 1e9:.3f}e9")
    if args.other:
        this, other = runs["this tree"], runs["other tree"]
        ratios = "  ".join(f"{s} {other[s] / this[s]:.2f}x" for s in STAGES)
        print(f"other/this  {ratios}  total {sum(other.values()) / sum(this.values()):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
