"""transformers ``generate()`` throughput on the tiny GPT-2: traced / untraced (target >= 0.98),
and a hand-written OpenTelemetry equivalent (a span per call, an event per step) for comparison.

The arms are interleaved in one process (untraced, llmtrace, manual OTel, untraced, ...)
so that machine noise hits all of them alike; the ratio is of total tokens over total
time across the rounds.

    python benchmarks/bench_generate.py [--rounds 8] [--calls 6] [--tokens 32] [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def _manual_processor(span: Any) -> Any:
    from transformers import LogitsProcessor

    class StepEvents(LogitsProcessor):  # type: ignore[misc]
        """What a user would write by hand: an OTel event per decoding step."""

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            span.add_event("token")
            return scores

    return StepEvents()


def _run(model: Any, enc: Any, calls: int, tokens: int, manual: bool) -> tuple[int, float]:
    from opentelemetry import trace
    from transformers import LogitsProcessorList

    tracer = trace.get_tracer("manual")
    produced = 0
    start = time.perf_counter()
    for _ in range(calls):
        if manual:
            with tracer.start_as_current_span("llm.request") as span:
                out = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                     logits_processor=LogitsProcessorList([_manual_processor(span)]))
                span.set_attribute("gen_ai.usage.output_tokens", int(out.shape[-1] - enc["input_ids"].shape[-1]))
        else:
            out = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        produced += int(out.shape[0]) * (int(out.shape[-1]) - int(enc["input_ids"].shape[-1]))
    return produced, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    import torch

    import llmtrace
    from llmtrace.server.tiny_model import build_gpt2, train_tokenizer

    torch.set_num_threads(1)
    tokenizer = train_tokenizer(512)
    tokenizer.padding_side = "left"
    model = build_gpt2(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    prompts = ["the quick brown fox jumps over the lazy dog"] * args.batch
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    # An SDK provider for both traced arms; spans are built but not exported (export is
    # the exporter's cost, the same for both).
    llmtrace.instrument(exporter="none", gpu="off", metrics=False)
    llmtrace.uninstrument()
    _run(model, enc, 2, args.tokens, manual=False)  # warm-up

    totals = {arm: [0, 0.0] for arm in ("untraced", "llmtrace", "manual_otel")}
    per_round: dict[str, list[float]] = {"llmtrace": [], "manual_otel": []}
    for index in range(args.rounds):
        rates: dict[str, float] = {}
        arms = list(totals) if index % 2 == 0 else list(reversed(totals))  # ABC CBA: cancels drift
        for arm in arms:
            if arm == "llmtrace":
                llmtrace.instrument(exporter="none", gpu="off", metrics=False)
            produced, elapsed = _run(model, enc, args.calls, args.tokens, manual=arm == "manual_otel")
            if arm == "llmtrace":
                # The span builder's tail counts against llmtrace (conservative: in a server
                # it overlaps the next requests).
                start = time.perf_counter()
                llmtrace.flush()
                elapsed += time.perf_counter() - start
                llmtrace.uninstrument()
            totals[arm][0] += produced
            totals[arm][1] += elapsed
            rates[arm] = produced / elapsed
        for arm in per_round:
            per_round[arm].append(rates[arm] / rates["untraced"])
    rate = {arm: tokens / seconds for arm, (tokens, seconds) in totals.items()}
    print(json.dumps({
        "tokens_per_s": {arm: round(value, 1) for arm, value in rate.items()},
        "ratio_llmtrace": round(rate["llmtrace"] / rate["untraced"], 4),
        "ratio_manual_otel": round(rate["manual_otel"] / rate["untraced"], 4),
        "median_round_ratio_llmtrace": round(statistics.median(per_round["llmtrace"]), 4),
        "median_round_ratio_manual_otel": round(statistics.median(per_round["manual_otel"]), 4),
        "rounds": args.rounds, "calls_per_round": args.calls, "tokens": args.tokens, "batch": args.batch,
    }))


if __name__ == "__main__":
    main()
