"""Instruction counts under valgrind's callgrind, per thread: stable where CPU time on a shared
VM is not (its speed moved 2x between runs of the same arm on 2026-12-03)."""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

#: The child's line on stdout once it is set up (see :func:`ready`).
READY = "CALLGRIND-READY"
#: Where :func:`ready` finds the file whose existence means "instrumentation is on".
GO_ENV = "LLMTRACE_CALLGRIND_GO"


def ready() -> None:
    """In a child run with ``from_ready=True``: say that set-up is done, then wait until callgrind
    counts. Set-up that costs minutes under full instrumentation (importing torch and vLLM) runs
    uninstrumented, at a few times native speed. Does nothing when not run that way."""
    go = os.environ.get(GO_ENV)
    if not go:
        return
    print(READY, flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)  # counted: a few dozen polls, the same in every run, cancelled by differencing


def instructions_per_thread(argv: list[str], from_ready: bool = False) -> dict[int, int]:
    """Run *argv* under callgrind (one output file per thread) and return each thread's total
    instructions by thread number; 1 is the main thread. With *from_ready*, callgrind counts only
    from the moment the child calls :func:`ready` (turned on by ``callgrind_control``)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "cg.out")
        command = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}"]
        if not from_ready:
            subprocess.run([*command, *argv], capture_output=True, text=True, check=True)
        else:
            _run_from_ready([*command, "--instr-atstart=no", *argv], Path(tmp, "go"))
        return {int(path.name.rsplit("-", 1)[1]): int(re.findall(r"^summary: (\d+)", path.read_text(),
                                                                 re.MULTILINE)[-1])
                for path in Path(tmp).glob("cg.out-*")}


def per_request(command: Callable[[str, int], list[str]], arms: Sequence[str], requests: int, base: int,
                jobs: int = 1, unit: str = "request", from_ready: bool = False) -> dict[str, dict[str, float]]:
    """Instructions per request (or per *unit*: a forward, a decode) of each of *arms*: the callgrind
    totals of ``command(arm, requests)`` and ``command(arm, base)``, differenced (start-up and
    warm-up cancel out) and divided by ``requests - base``; the main (serving) thread alone and
    all threads. Each run is its own process, so *jobs* runs may overlap without changing the
    counts. *from_ready*: see :func:`instructions_per_thread`."""
    if requests <= base:
        raise ValueError(f"requests ({requests}) must be more than base ({base})")

    def totals(arm: str, count: int) -> tuple[int, int]:
        per_thread = instructions_per_thread(command(arm, count), from_ready)
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


def _run_from_ready(command: list[str], go: Path) -> None:
    log = go.with_name("stderr.log")  # a file, not a pipe: a chatty child cannot fill it and stall
    with log.open("w") as errors, subprocess.Popen(command, env={**os.environ, GO_ENV: str(go)},
                                                   stdout=subprocess.PIPE, stderr=errors, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip() == READY:
                break
        else:
            child.wait()
            raise SystemExit(f"{command[-1]}: exited before it was ready:\n{log.read_text()[-3000:]}")
        # valgrind runs in the child's own process: its pid is the one callgrind_control addresses.
        subprocess.run(["callgrind_control", "--instr=on", str(child.pid)], capture_output=True, check=True)
        go.touch()
        child.stdout.read()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command[-4:])}: exit {child.returncode}:\n{log.read_text()[-3000:]}")


def process_tree_command(out_dir: Path) -> list[str]:
    """valgrind's callgrind over a process and every program it starts (multiprocessing's resource
    tracker left out), one output file per process and thread in *out_dir*, counting nothing until
    :func:`count_from_now` turns it on; read the counts with :func:`totals_by_thread`."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    return ["valgrind", "--tool=callgrind", "--trace-children=yes", "--trace-children-skip-by-arg=*resource_tracker*",
            "--instr-atstart=no", "--separate-threads=yes", f"--callgrind-out-file={out_dir}/cg.%p"]


def count_from_now(pids: Sequence[int]) -> None:
    """Turn counting on in the callgrind runs *pids* and zero what they counted so far."""
    for pid in pids:
        for option in ("--instr=on", "--zero"):
            subprocess.run(["callgrind_control", option, str(pid)], capture_output=True, check=True)


def totals_by_thread(out_dir: Path) -> dict[tuple[int, int], int]:
    """Each thread's instructions in its process's final dump, by (pid, valgrind's thread number):
    from :func:`count_from_now` to the process's exit. Thread numbers go by creation, and
    valgrind gives a finished thread's number to the next one."""
    totals: dict[tuple[int, int], int] = {}
    for path in out_dir.glob("cg.*-*"):
        match = re.fullmatch(r"cg\.(\d+)-(\d+)", path.name)  # a final dump, not an explicit one
        if match:
            found = re.findall(r"^(?:summary|totals): (\d+)", path.read_text(), re.MULTILINE)
            totals[int(match[1]), int(match[2])] = int(found[-1]) if found else 0
    return totals


def print_ratios(counted: dict[str, dict[str, float]], title: str, thread_label: str = "serving thread") -> None:
    """The table of :func:`per_request`'s counts in thousands, with each arm's ratio to ``untraced``
    on the serving thread (when that arm ran)."""
    untraced = counted.get("untraced")
    print(f"\n{title}")
    print(f"{'arm':<12} {thread_label:>14} {'all threads':>12} {'ratio':>7}")
    for arm, count in counted.items():
        thread, total = count["thread_instructions"], count["all_instructions"]
        ratio = f"{thread / untraced['thread_instructions']:.3f}" if untraced else "-"
        print(f"{arm:<12} {thread / 1000:13.1f}k {total / 1000:11.1f}k {ratio:>7}")


def step_arguments(parser: argparse.ArgumentParser, arms: Sequence[str], default: Sequence[str] | None = None) -> None:
    """The options of a benchmark counted per step in arms (``--steps``, ``--base``, ``--arms``
    (*default*: all of them), ``--jobs``, and the hidden ``--child``/``--model`` of its child runs)."""
    parser.add_argument("--steps", type=int, default=1200, help="engine steps in the long runs (default 1200)")
    parser.add_argument("--base", type=int, default=200, help="engine steps in the short runs (default 200)")
    parser.add_argument("--arms", default=",".join(arms if default is None else default),
                        help=f"comma-separated, of {', '.join(arms)}")
    parser.add_argument("--jobs", type=int, default=2, help="callgrind runs at once (default 2)")
    parser.add_argument("--child", choices=arms, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)


def chosen_arms(parser: argparse.ArgumentParser, text: str, arms: Sequence[str]) -> list[str]:
    """The arms named in *text* (comma-separated); a usage error names any unknown one."""
    chosen = [arm.strip() for arm in text.split(",") if arm.strip()]
    unknown = sorted(set(chosen) - set(arms))
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(arms)}")
    return chosen
