#!/usr/bin/env python3
"""What tracing transformers' continuous batching costs: CPU per engine step, traced vs untraced.

A random-weight 2-layer Llama on the CPU runs the same ``generate_batch`` workload (N requests
of M new tokens, prompts of mixed length, a small paged cache) in fresh processes, untraced,
with ``llmtrace.instrument()`` tracing everything (spans to a file), and at production
sampling (10 % of requests, 10 % of engine windows), rotating the order each round so that
machine noise hits the arms alike. Each run reports the process CPU time of the
generation (all threads: the engine loop, llmtrace's span builder and exporter) and the number
of engine steps; the cost is the median difference per step and per token.

On a GPU a step of a real model takes milliseconds; this tiny CPU model takes about one, so
the *ratio* here is a worst case — the per-step microseconds are the number to carry over.

    python benchmarks/bench_transformers_cb.py [--requests 64] [--tokens 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

ARMS = {"untraced": None, "full": {}, "production": {"sample_ratio": 0.1, "engine_sample_ratio": 0.1}}


def child(arm: str, requests: int, tokens: int, out: str) -> None:
    options = ARMS[arm]
    traced = options is not None
    if options is not None:
        import llmtrace

        llmtrace.instrument(exporter=f"file:{out}", metrics=False, gpu="off", **options)
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    generation = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    paged = ContinuousBatchingConfig(page_size=16, num_blocks=256, max_batch_tokens=256)
    prompts = [list(range(1, 4 + 7 * (n % 5))) for n in range(requests)]
    model.generate_batch(inputs=prompts[:4], generation_config=generation, continuous_batching_config=paged)  # warm
    steps = _count_steps()
    cpu, wall = time.process_time(), time.perf_counter()
    outputs = model.generate_batch(inputs=prompts, generation_config=generation, continuous_batching_config=paged)
    if traced:
        import llmtrace

        llmtrace.flush()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    generated = sum(len(o.generated_tokens) for o in outputs.values())
    print(json.dumps({"cpu_s": cpu, "wall_s": wall, "steps": steps(), "tokens": generated}))


def _count_steps() -> Callable[[], int]:
    """Engine steps from here on: counted by wrapping update_batch (one per step), in both arms."""
    from transformers.generation.continuous_batching import continuous_api

    processor = continuous_api.ContinuousBatchProcessor
    original = processor.update_batch
    count = [0]

    def counted(self: object) -> None:
        count[0] += 1
        original(self)  # type: ignore[arg-type]

    processor.update_batch = counted  # type: ignore[method-assign]
    return lambda: count[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", choices=sorted(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--out", default="/dev/null", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.requests, args.tokens, args.out)
        return
    import tempfile

    runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            order = list(ARMS)[index % len(ARMS):] + list(ARMS)[:index % len(ARMS)]
            for arm in order:
                out = subprocess.run([sys.executable, __file__, "--child", arm, "--out", f"{tmp}/{arm}{index}.jsonl",
                                      "--requests", str(args.requests), "--tokens", str(args.tokens)],
                                     capture_output=True, text=True, check=True).stdout
                result = json.loads(out.strip().splitlines()[-1])
                runs[arm].append(result)
                print(f"round {index + 1} {arm:<10} {result['cpu_s']:.3f} s CPU, {result['steps']} steps, "
                      f"{result['tokens']} tokens", file=sys.stderr)
    base = runs["untraced"]
    steps = statistics.median(r["steps"] for r in base)
    tokens = statistics.median(r["tokens"] for r in base)
    print(f"transformers continuous batching, {args.requests} requests x {args.tokens} tokens "
          f"({tokens:.0f} tokens in {steps:.0f} steps, ~{tokens / steps:.0f} per step), {args.rounds} rounds:")
    for arm in ("full", "production"):
        pairs = list(zip(runs[arm], base, strict=True))
        per_step = sorted((t["cpu_s"] - u["cpu_s"]) / t["steps"] * 1e6 for t, u in pairs)
        ratio = sorted(u["cpu_s"] / t["cpu_s"] for t, u in pairs)
        print(f"  {arm:<10} llmtrace's CPU per engine step {statistics.median(per_step):6.0f} µs "
              f"(rounds: {', '.join(f'{x:.0f}' for x in per_step)}), "
              f"{statistics.median(per_step) * steps / tokens:.1f} µs per token; CPU ratio traced/untraced "
              f"{statistics.median(ratio):.3f} (rounds: {', '.join(f'{x:.3f}' for x in ratio)})")


if __name__ == "__main__":
    main()
