"""transformers ``generate()`` throughput on the tiny GPT-2: traced / untraced (target >= 0.98),
and a hand-written OpenTelemetry equivalent (a span per call, an event per step) for comparison.

The arms are interleaved in one process (ABC, CBA, ...) so that machine noise hits all
of them alike. Throughput is tokens per second of *process CPU time* (every thread: the
model, llmtrace's span builder, export): on a shared host, wall time mostly measures the
neighbours. Wall-clock rates are reported too.

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


def _run(model: Any, enc: Any, calls: int, tokens: int, manual: bool) -> tuple[int, float, float]:
    from opentelemetry import trace
    from transformers import LogitsProcessorList

    tracer = trace.get_tracer("manual")
    produced = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(calls):
        if manual:
            with tracer.start_as_current_span("llm.request") as span:
                out = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                     logits_processor=LogitsProcessorList([_manual_processor(span)]))
                span.set_attribute("gen_ai.usage.output_tokens", int(out.shape[-1] - enc["input_ids"].shape[-1]))
        else:
            out = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        produced += int(out.shape[0]) * (int(out.shape[-1]) - int(enc["input_ids"].shape[-1]))
    return produced, time.process_time() - cpu_start, time.perf_counter() - start


def _accounting(model: Any, enc: Any, tokens: int, untraced_cpu_per_call: float, repeat: int = 200) -> dict[str, float]:
    """llmtrace's own CPU per generate() call, measured piece by piece (robust on a busy host):
    the forward hooks per step, the wrapper around a stubbed generate, the span builder."""
    import llmtrace
    from llmtrace.integrations.torch import patch as torch_patch
    from llmtrace.integrations.transformers import generate as gen

    llmtrace.instrument(exporter="none", gpu="off", metrics=False)
    output = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    sink = torch_patch.StepSink(model)
    token = torch_patch.set_sink(sink)
    args, kwargs = (), {"input_ids": enc["input_ids"]}
    start = time.thread_time_ns()
    for _ in range(repeat * tokens):
        torch_patch._pre_hook(model, args, kwargs)
        torch_patch._post_hook(model, args, kwargs, None)
    hook_us = (time.thread_time_ns() - start) / (repeat * tokens) / 1e3
    torch_patch.reset_sink(token)

    def stub(*_: Any, **__: Any) -> Any:
        sink_now = torch_patch._sink.get()
        if sink_now is not None:
            sink_now.forward_ns.extend(time.monotonic_ns() for _ in range(tokens))
        return output

    llmtrace.flush()
    cpu_start, thread_start = time.process_time(), time.thread_time()
    for _ in range(repeat):
        gen.generate_wrapper(stub, model, (), dict(**enc, max_new_tokens=tokens, do_sample=False))
    wrapper_us = (time.thread_time() - thread_start) / repeat * 1e6
    llmtrace.flush(60)
    total_us = (time.process_time() - cpu_start) / repeat * 1e6
    llmtrace.uninstrument()
    per_call = hook_us * tokens + total_us
    return {"hook_pair_us_per_step": round(hook_us, 3), "wrapper_us_per_call": round(wrapper_us, 1),
            "wrapper_and_builder_us_per_call": round(total_us, 1),
            "untraced_cpu_ms_per_call": round(untraced_cpu_per_call * 1e3, 2),
            "accounted_ratio": round(untraced_cpu_per_call / (untraced_cpu_per_call + per_call * 1e-6), 4)}


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

    totals = {arm: [0, 0.0, 0.0] for arm in ("untraced", "llmtrace", "manual_otel")}
    per_round: dict[str, list[float]] = {"llmtrace": [], "manual_otel": []}
    for index in range(args.rounds):
        rates: dict[str, float] = {}
        arms = list(totals) if index % 2 == 0 else list(reversed(totals))  # ABC CBA: cancels drift
        for arm in arms:
            if arm == "llmtrace":
                llmtrace.instrument(exporter="none", gpu="off", metrics=False)
            produced, cpu, wall = _run(model, enc, args.calls, args.tokens, manual=arm == "manual_otel")
            if arm == "llmtrace":
                # The span builder's tail counts against llmtrace (conservative: in a server
                # it overlaps the next requests).
                start, cpu_start = time.perf_counter(), time.process_time()
                llmtrace.flush()
                cpu += time.process_time() - cpu_start
                wall += time.perf_counter() - start
                llmtrace.uninstrument()
            totals[arm][0] += produced
            totals[arm][1] += cpu
            totals[arm][2] += wall
            rates[arm] = produced / cpu
        for arm, ratios in per_round.items():
            ratios.append(rates[arm] / rates["untraced"])
    calls = args.rounds * args.calls
    accounting = _accounting(model, enc, args.tokens, totals["untraced"][1] / calls)
    rate = {arm: tokens / cpu for arm, (tokens, cpu, _) in totals.items()}
    wall_rate = {arm: tokens / wall for arm, (tokens, _, wall) in totals.items()}
    print(json.dumps({
        "tokens_per_cpu_s": {arm: round(value, 1) for arm, value in rate.items()},
        "tokens_per_wall_s": {arm: round(value, 1) for arm, value in wall_rate.items()},
        "wall_ratio_llmtrace": round(wall_rate["llmtrace"] / wall_rate["untraced"], 4),
        "ratio_llmtrace": round(rate["llmtrace"] / rate["untraced"], 4),
        "ratio_manual_otel": round(rate["manual_otel"] / rate["untraced"], 4),
        "median_round_ratio_llmtrace": round(statistics.median(per_round["llmtrace"]), 4),
        "median_round_ratio_manual_otel": round(statistics.median(per_round["manual_otel"]), 4),
        "accounting": accounting,
        "rounds": args.rounds, "calls_per_round": args.calls, "tokens": args.tokens, "batch": args.batch,
    }))


if __name__ == "__main__":
    main()
