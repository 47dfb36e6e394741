#!/usr/bin/env python3
"""Instructions per model forward of llmtrace's forward hooks (callgrind), by what the forward runs in.

A hooked model's forward goes through torch's hook dispatch whatever the hooks do; what the
hooks do depends on whether anything would record the forward:

* ``untraced``   — no llmtrace, no hooks;
* ``unobserved`` — ``instrument()`` at production sampling and the model hooked as an engine's
  is (``always=False``), forwards outside any request or recording span: an engine loop's,
  whose step phases time the forward, or an unsampled request's;
* ``recorded``   — the same, each forward inside a sampled request: an ``llm.forward`` span.

Each arm is a fresh process run twice, with *forwards* and *base* forwards of a tiny
``nn.Linear``; the difference of the two callgrind totals over the difference of the counts
is the instructions per forward (start-up cancels). Needs valgrind.

    python benchmarks/bench_forward_hooks.py [--forwards 2500] [--base 500] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import sys

ARMS = ("untraced", "unobserved", "recorded")


def child(arm: str, forwards: int) -> None:
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 4)
    handle = None
    if arm != "untraced":
        import llmtrace
        from llmtrace.integrations.torch import patch

        llmtrace.instrument(exporter="none", sample_ratio=0.1, engine_sample_ratio=0.1, gpu="off")
        patch.hook_model(model, always=False)
        if arm == "recorded":
            from llmtrace.lifecycle.request import start_request

            handle = start_request("bench")
            while not handle.recording:  # 10 % of requests are sampled: take one that is
                handle = start_request("bench")
    inputs = torch.zeros(1, 4)
    with torch.inference_mode():
        if handle is not None:
            with handle.activate():
                for _ in range(forwards):
                    model(inputs)
        else:
            for _ in range(forwards):
                model(inputs)
    os._exit(0)  # the teardown's instructions would not cancel out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forwards", type=int, default=2500)
    parser.add_argument("--base", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1, help="valgrind runs at a time (the counts do not depend on it)")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.forwards)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _callgrind import per_request

    counted = per_request(lambda arm, count: [sys.executable, os.path.abspath(__file__), "--child", arm,
                                              "--forwards", str(count)],
                          ARMS, args.forwards, args.base, args.jobs, unit="forward")
    # The main thread: the forwards' (the span builder's work is on its own thread).
    results = {arm: row["thread_instructions"] for arm, row in counted.items()}
    for arm, per_forward in results.items():
        print(f"{arm:<11} {per_forward / 1000:7.1f}k instructions per forward "
              f"({per_forward - results['untraced']:+9.0f} vs untraced)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
