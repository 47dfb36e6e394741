"""Instruction counts under valgrind's callgrind, per thread: stable where CPU time on a shared
VM is not (its speed moved 2x between runs of the same arm on 2026-12-03)."""

from __future__ import annotations

import concurrent.futures
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path


def instructions_per_thread(argv: list[str]) -> dict[int, int]:
    """Run *argv* under callgrind (one output file per thread) and return each thread's total
    instructions by thread number; 1 is the main thread."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                        *argv], capture_output=True, text=True, check=True)
        return {int(path.name.rsplit("-", 1)[1]): int(re.findall(r"^summary: (\d+)", path.read_text(),
                                                                 re.MULTILINE)[-1])
                for path in Path(tmp).glob("cg.out-*")}


def per_request(command: Callable[[str, int], list[str]], arms: Sequence[str], requests: int, base: int,
                jobs: int = 1, unit: str = "request") -> dict[str, dict[str, float]]:
    """Instructions per request (or per *unit*: a forward, a decode) of each of *arms*: the callgrind
    totals of ``command(arm, requests)`` and ``command(arm, base)``, differenced (start-up and
    warm-up cancel out) and divided by ``requests - base``; the main (serving) thread alone and
    all threads. Each run is its own process, so *jobs* runs may overlap without changing the
    counts."""
    if requests <= base:
        raise ValueError(f"requests ({requests}) must be more than base ({base})")

    def totals(arm: str, count: int) -> tuple[int, int]:
        per_thread = instructions_per_thread(command(arm, count))
        return per_thread[1], sum(per_thread.values())

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = {(arm, count): pool.submit(totals, arm, count) for arm in arms for count in (requests, base)}
    result: dict[str, dict[str, float]] = {}
    for arm in arms:
        (thread_hi, all_hi), (thread_lo, all_lo) = runs[arm, requests].result(), runs[arm, base].result()
        result[arm] = {"thread_instructions": (thread_hi - thread_lo) / (requests - base),
                       "all_instructions": (all_hi - all_lo) / (requests - base)}
        print(f"{arm:<14} {result[arm]['thread_instructions'] / 1000:8.1f}k instructions per {unit} on the "
              f"serving thread, {result[arm]['all_instructions'] / 1000:8.1f}k in all threads", file=sys.stderr)
    return result
