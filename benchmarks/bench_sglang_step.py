"""Scheduler-thread cost of the SGLang adapter per engine step (budget: <= 20 µs at batch 32).

One decode step as SGLang's scheduler runs it — ``get_next_batch_to_run``, ``run_batch``,
``process_batch_result`` with the output streamer inside it — through the adapter's real
hooks (llmtrace/integrations/sglang/_engine.py) put in the classes as ``instrument()`` puts
them and, as the baseline, the same methods unhooked. The SGLang side is stand-ins with the
attributes the hooks read (a
``Req``'s ``rid``, ``output_ids`` array, ``finished()``, ``time_stats``; a batch's
``forward_mode``, ``reqs``; the scheduler's queue, KV allocator and radix cache): what is
measured is llmtrace's work on the scheduler thread, not SGLang's. No SGLang import, so it
runs in the main venv, under valgrind too.

    python benchmarks/bench_sglang_step.py                  # thread CPU µs per step (noisy on a shared VM)
    python benchmarks/bench_sglang_step.py --instructions   # callgrind: instructions per step (stable)

``--instructions`` runs each arm for 1,500 and 500 steps under callgrind and differences them
(start-up cancels out); the adapter's cost is traced minus bare per step. It is converted to
µs with this machine's own rate for the traced loop (its thread CPU time over its instruction
count, measured in the same invocation).
"""

from __future__ import annotations

import argparse
import enum
import os
import statistics
import sys
import time
from array import array
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BUDGET_US = 20.0


class ForwardMode(enum.IntEnum):  # SGLang's enum names what the adapter reads
    EXTEND = 1
    DECODE = 2


class TimeStats:
    pass


class SamplingParams:
    max_new_tokens = 1_000_000
    temperature = 0.0
    top_p = 1.0


class Req:
    """The attributes of ``sglang.srt.managers.schedule_batch.Req`` the adapter reads per step."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.output_ids = array("q")
        self.finished_reason = None
        self.time_stats = TimeStats()

    def finished(self) -> bool:
        return self.finished_reason is not None


class RecvReq:
    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.input_ids = array("q", range(16))
        self.sampling_params = SamplingParams()
        self.stream = True
        self.time_stats = TimeStats()


class Batch:
    def __init__(self, reqs: list[Req]) -> None:
        self.reqs = reqs
        self.forward_mode = ForwardMode.DECODE


class Plan:
    def __init__(self, batch: Batch) -> None:
        self.batch_to_run = batch
        self.running_batch = batch


class Allocator:
    size = 65536

    def available_size(self) -> int:
        return 40000


class TreeCache:
    def evictable_size(self) -> int:
        return 1000


class Streamer:
    """``SchedulerOutputStreamer``: sends a step's outputs (here: nothing)."""

    def stream_output(self, reqs: list[Req]) -> None:
        return None


class Scheduler:
    """The four ``Scheduler`` methods of a decode step, doing the least SGLang's would."""

    def __init__(self, batch: Batch, streamer: Streamer) -> None:
        self.plan = Plan(batch)
        self.streamer = streamer
        self.waiting_queue: list[Req] = []
        self.token_to_kv_pool_allocator = Allocator()
        self.tree_cache = TreeCache()
        self.tp_size = 1

    def get_next_batch_to_run(self) -> Plan:
        return self.plan

    def run_batch(self, batch: Batch) -> Result:
        return Result()

    def process_batch_result(self, batch: Batch, result: Result) -> None:
        for req in batch.reqs:
            req.output_ids.append(7)  # SGLang appends the step's token
        self.streamer.stream_output(batch.reqs)

    def handle_generate_request(self, recv_req: RecvReq) -> None:
        return None


class Result:
    __slots__ = ()


def _classes(traced: bool) -> tuple[type[Scheduler], type[Streamer]]:
    """The scheduler and streamer classes, their methods hooked by the adapter when *traced* (as
    ``instrument()`` hooks SGLang's: the adapter's hook in the class in place of the method)."""
    if not traced:
        return Scheduler, Streamer
    from llmtrace.integrations.sglang import _engine

    class HookedScheduler(Scheduler):
        pass

    class HookedStreamer(Streamer):
        pass

    hooks: tuple[tuple[type, str, Any, dict[str, int]], ...] = (
        (HookedScheduler, "get_next_batch_to_run", _engine.get_next_batch_hook, {}),
        (HookedScheduler, "run_batch", _engine.run_batch_hook, {"batch": 0}),
        (HookedScheduler, "process_batch_result", _engine.process_result_hook, {"batch": 0, "result": 1}),
        (HookedScheduler, "handle_generate_request", _engine.handle_generate_hook, {"recv_req": 0}),
        (HookedStreamer, "stream_output", _engine.stream_output_hook, {"reqs": 0}))
    for cls, name, make, positions in hooks:
        setattr(cls, name, make(vars(cls.__mro__[1])[name], positions))
    return HookedScheduler, HookedStreamer


def run(steps: int, batch_size: int, traced: bool) -> float:
    """Thread CPU µs per step of *steps* decode steps at *batch_size*."""
    reqs = [Req(f"r{i}") for i in range(batch_size)]
    scheduler_class, streamer_class = _classes(traced)
    scheduler = scheduler_class(Batch(reqs), streamer_class())
    for req in reqs:
        scheduler.handle_generate_request(RecvReq(req.rid))
    start = time.thread_time()
    for _ in range(steps):
        plan = scheduler.get_next_batch_to_run()
        result = scheduler.run_batch(plan.batch_to_run)
        scheduler.process_batch_result(plan.batch_to_run, result)
    return (time.thread_time() - start) / steps * 1e6


def _instrument() -> None:
    import llmtrace

    # The default windows (256 steps or 1 s): a closed window's spans are built on the span
    # builder's thread, which neither measure counts (thread CPU time, the main thread's instructions).
    llmtrace.instrument(exporter="none", metrics=False, gpu="off")


def count_instructions(batch_size: int) -> None:
    from _callgrind import instructions_per_thread

    def total(steps: int, arm: str) -> int:
        argv = [sys.executable, __file__, "--loop-only", arm, "--steps", str(steps), "--batch", str(batch_size)]
        return instructions_per_thread(argv)[1]  # 1: the main thread

    per_step = {arm: (total(1500, arm) - total(500, arm)) / 1000 for arm in ("bare", "traced")}
    adapter = per_step["traced"] - per_step["bare"]
    # This machine's rate for the traced loop, outside valgrind: thread CPU time / instructions.
    _instrument()
    cpu_us = statistics.median(run(1000, batch_size, traced=True) for _ in range(5))
    us = adapter * cpu_us / per_step["traced"]
    print(f"scheduler thread, batch {batch_size}: adapter {adapter / 1000:.1f}k instructions per step "
          f"(traced {per_step['traced'] / 1000:.1f}k, bare {per_step['bare'] / 1000:.1f}k); at this machine's "
          f"{per_step['traced'] / cpu_us:.0f} instructions/µs: {us:.1f} µs per step (budget {BUDGET_US:.0f} µs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under valgrind (stable on a noisy host; ~1 min)")
    parser.add_argument("--loop-only", choices=("bare", "traced"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions:
        count_instructions(args.batch)
        return
    _instrument()
    if args.loop_only:  # one loop and nothing else, for count_instructions()
        run(args.steps, args.batch, traced=args.loop_only == "traced")
        os._exit(0)  # skip the interpreter's teardown: its instructions would not cancel out
    costs = sorted(run(args.steps, args.batch, True) - run(args.steps, args.batch, False)
                   for _ in range(args.repeat))
    print(f"scheduler thread, batch {args.batch}: {statistics.median(costs):.2f} µs CPU per step for the adapter "
          f"(budget {BUDGET_US:.0f} µs; median of {args.repeat}, range {costs[0]:.2f}-{costs[-1]:.2f})")


if __name__ == "__main__":
    main()
