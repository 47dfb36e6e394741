"""Instructions per streamed decode through llmtrace's tokenizer hooks.

A streaming server decodes once per token (``tokenizer.decode([token_id])``, as the reference
server does), through transformers' ``decode`` and the tokenizers ``decode`` nested in it — both
hooked by llmtrace. Arms, each in its own process, the reference server's BPE tokenizer (trained
on the spot, as a ``PreTrainedTokenizerFast``):

* ``untraced``: no llmtrace;
* ``unsampled``: ``instrument(sample_ratio=0)``, the decodes inside an unsampled request (the
  request current, as in a request handler): the hooks only check that nothing records;
* ``sampled``: ``instrument()``, inside a sampled request: each decode timed and added to the
  request's detokenize total.

Counted with callgrind on the main thread from the end of the warm-up, runs of *decodes* and
*base* decodes differenced, divided by their difference.

    python benchmarks/bench_decode_hook.py [--decodes 3000 --base 1000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ARMS = ("untraced", "unsampled", "sampled")
WARMUP = 200


def child(arm: str, decodes: int) -> None:
    """Decode *decodes* one-token lists in *arm*, then leave at once (no teardown in the count)."""
    from _callgrind import ready

    with tempfile.TemporaryDirectory() as tmp:
        handle = None
        if arm != "untraced":
            import llmtrace

            llmtrace.instrument(exporter=f"file:{tmp}/traces.jsonl", gpu="off",
                                sample_ratio=0.0 if arm == "unsampled" else 1.0)
            handle = llmtrace.start_request(model="tiny", max_tokens=decodes + WARMUP, stream=True)
        from llmtrace.server.tiny_model import train_tokenizer

        tokenizer = train_tokenizer(cache_dir=tmp)
        ids = tokenizer.encode("Prefill processes the whole prompt, then decode produces one token per step.")
        if handle is not None:
            handle.__enter__()  # the request current, as in its handler
        for index in range(WARMUP):
            tokenizer.decode([ids[index % len(ids)]])
        ready()  # counted from here: training the tokenizer does not count the same in every run
        for index in range(decodes):
            tokenizer.decode([ids[index % len(ids)]])
        os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decodes", type=int, default=3000, help="the longer run's decodes")
    parser.add_argument("--base", type=int, default=1000, help="the shorter run's decodes")
    parser.add_argument("--jobs", type=int, default=1, help="valgrind runs at a time (the counts do not depend on it)")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.decodes)
        return 0
    if args.decodes <= args.base:
        parser.error(f"--decodes {args.decodes} must be more than --base {args.base}")
    from _callgrind import per_request

    counted = per_request(lambda arm, count: [sys.executable, __file__, "--child", arm, "--decodes", str(count)],
                          ARMS, args.decodes, args.base, args.jobs, unit="decode", from_ready=True)
    base = counted["untraced"]["thread_instructions"]
    for arm in ARMS:
        row = counted[arm]
        row["ratio"] = row["thread_instructions"] / base
        print(f"{arm:<10} {row['thread_instructions'] / 1000:7.1f}k instructions per decode, "
              f"{row['ratio']:.3f}x untraced")
    print(json.dumps(counted, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
