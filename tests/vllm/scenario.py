"""Runs the real vLLM ``LLM`` (API side + EngineCore process + Scheduler) with the fake executor.

``python -m tests.vllm.scenario MODEL_DIR [--requests N] [--max-tokens N] [--blocks N] [--stop]
[--shared-prefix] [--log-stats] [--otlp-traces-endpoint URL]``
prints one JSON line with what vLLM returned. llmtrace is turned on the way a
deployment turns it on: by the ``vllm.general_plugins`` entry point, when the
caller exports ``LLMTRACE_VLLM=1`` (or by ``--instrument``, calling
``llmtrace.instrument()`` in this process before vLLM is imported). With
``--otlp-traces-endpoint``, vLLM's *own* tracing exports its ``llm_request`` spans there.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

#: A system prompt several blocks long that every --shared-prefix request starts with.
SHARED_PREFIX = "you are a helpful assistant, answer briefly. "
PROMPTS = ["hello world the quick brown fox", "the lazy dog jumps over the quick brown fox again and again",
           "brown fox", "over the lazy dog the quick brown fox jumps hello world"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--blocks", type=int, default=0, help="num_gpu_blocks_override (small -> preemption)")
    parser.add_argument("--stop", action="store_true", help="stop string = the fake token's text")
    parser.add_argument("--shared-prefix", action="store_true",
                        help="prompts share a long prefix; the first runs alone, so the rest hit the prefix cache")
    parser.add_argument("--instrument", action="store_true", help="llmtrace.instrument() before importing vLLM")
    parser.add_argument("--otlp-traces-endpoint", default=None, help="vLLM's own tracing (no llmtrace needed)")
    parser.add_argument("--log-stats", action="store_true",
                        help="vLLM's request stats on, as `vllm serve` has them (LLM's default is off)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if args.instrument:
        import llmtrace

        llmtrace.instrument()
    from tests.vllm.fake_executor import TOKEN_ID
    from vllm import LLM, SamplingParams

    extra: dict[str, Any] = {"num_gpu_blocks_override": args.blocks} if args.blocks else {}
    if args.log_stats:
        extra["disable_log_stats"] = False
    if args.otlp_traces_endpoint:
        extra["otlp_traces_endpoint"] = args.otlp_traces_endpoint
        extra["disable_log_stats"] = False  # vLLM's request spans are built from its stats (on in `vllm serve`)
    llm = LLM(model=args.model, load_format="dummy", max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64,
              enforce_eager=True, distributed_executor_backend="tests.vllm.fake_executor.FakeExecutor",
              block_size=16, **extra)
    stop = None
    if args.stop:
        stop = [llm.get_tokenizer().decode([TOKEN_ID])]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, stop=stop)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    if args.shared_prefix:
        prompts = [SHARED_PREFIX + p for p in prompts]
        outputs = llm.generate(prompts[:1], params, use_tqdm=False)  # fills the cache
        outputs += llm.generate(prompts[1:], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    result = [{"id": o.request_id, "tokens": len(o.outputs[0].token_ids), "finish": o.outputs[0].finish_reason,
               "prompt_tokens": len(o.prompt_token_ids or ()), "cached": o.num_cached_tokens}
              for o in outputs]
    print("SCENARIO " + json.dumps(result), flush=True)
    if args.instrument:
        import llmtrace
        from llmtrace.integrations.vllm import _engine

        # An in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0): how its steps were counted.
        counts = [s.counter.counted() if s.counter is not None else None for s in _engine.engine_states()]
        print("ENGINE " + json.dumps({"compiled_counts": counts}), flush=True)
        llmtrace.shutdown()


if __name__ == "__main__":
    main()
