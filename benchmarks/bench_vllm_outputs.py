"""API-server-thread cost of the vLLM adapter per engine step, through vLLM's real OutputProcessor.

vLLM's own ``OutputProcessor`` (the API server's half of ``AsyncLLM``: it turns each batch of
``EngineCoreOutput`` into ``RequestOutput``s, detokenizing incrementally with the model's real
tokenizer) fed what EngineCore sends: each step one token for each of 8 running requests of 20
prompt and 16 output tokens, each replaced when it finishes. vLLM's request stats are on, as
``vllm serve`` has them: each step's outputs are processed with an ``IterationStats``, and a
request's first output carries its ``QUEUED``/``SCHEDULED`` events and ``PrefillStats``. Each
request enters through ``add_request`` (as ``AsyncLLM.add_request`` does), where the adapter
opens ``llm.request`` and writes its W3C context; the outputs of a request the adapter kept an
EngineCore record for (a sampled one) carry what the adapter's EngineCore half puts on them (the
first-token summary on its first token, the whole summary on its last), so the API side decodes
them as in a deployment. No HTTP and no engine: what is measured is vLLM's output processing and
llmtrace's hooks on it, on the thread that runs them.

Arms, each in its own process: ``untraced`` (llmtrace not imported), ``production``
(``LLMTRACE_SAMPLE_RATIO=0.1``), ``full`` (every request sampled). Spans are built on the span
builder's thread and dropped (``exporter="none"``); metrics are on, as in a deployment (the API
server records every request's).

    python benchmarks/bench_vllm_outputs.py                     # callgrind, instructions per step
    python benchmarks/bench_vllm_outputs.py --steps 2000 --base 400 --jobs 2

Set-up (importing torch and vLLM, loading the tokenizer) runs before callgrind starts counting
(``_callgrind.ready``); each arm's count at ``--steps`` minus its count at ``--base`` is divided
by the difference.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ARMS = ("untraced", "production", "full")
ARM_ENV = {"production": {"LLMTRACE_SAMPLE_RATIO": "0.1"}, "full": {"LLMTRACE_SAMPLE_RATIO": "1"}}
RUNNING, PROMPT_TOKENS, OUTPUT_TOKENS = 8, 20, 16
#: What the adapter's EngineCore half sends (integers, durations in ns): queue 1 ms, prefill 2 ms,
#: and at the end decode 30 ms, no stall or preemption, steps 5..20.
FIRST_SUMMARY = {"queue_s": 0.001, "prefill_s": 0.002, "preemptions": 0, "first_step": 5}
FINAL_SUMMARY = {**FIRST_SUMMARY, "decode_s": 0.03, "decode_stall_s": 0.0, "last_step": 20, "decode_steps": 15}


def child(arm: str, steps: int, model: str) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.update(ARM_ENV.get(arm, {}))
    traced = arm != "untraced"
    if traced:
        import llmtrace

        llmtrace.instrument(exporter="none", gpu="off")
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    hooked = getattr(vars(OutputProcessor)["process_outputs"], "_self_llmtrace", False)
    if hooked != traced:
        raise SystemExit(f"{arm}: OutputProcessor.process_outputs {'is' if hooked else 'is not'} hooked")
    from llmtrace.integrations.vllm import _constants as C  # the wire format only: no hooks, no state
    from llmtrace.integrations.vllm import extractors as X

    first_headers = {X.SUMMARY_KEY: X.encode_summary(FIRST_SUMMARY)} if traced else None
    final_headers = {X.SUMMARY_KEY: X.encode_summary(FINAL_SUMMARY)} if traced else None
    processor = OutputProcessor(get_tokenizer(model), log_stats=True)
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    running: dict[str, int] = {}  # request id -> tokens sent
    engine_records: set[str] = set()  # requests the adapter's EngineCore half would keep a record of
    added = 0

    def top_up() -> None:
        nonlocal added
        while len(running) < RUNNING:
            request_id = f"r{added}"
            prompt = [3 + (added + i) % 250 for i in range(PROMPT_TOKENS)]
            request = EngineCoreRequest(request_id, prompt, None, params, None, arrival_time=time.time(),
                                        lora_request=None, cache_salt=None, data_parallel_rank=None,
                                        prompt_embeds=None, prompt_is_token_ids=True,
                                        external_req_id=request_id)
            processor.add_request(request, None)
            if traced and C.NO_ENGINE_RECORD_KEY not in (request.trace_headers or {}):
                engine_records.add(request_id)
            running[request_id] = 0
            added += 1

    def step() -> None:
        now = time.monotonic()
        processor.process_outputs(_step_outputs(running, engine_records, first_headers, final_headers, now),
                                  now, IterationStats())
        top_up()

    top_up()
    for _ in range(200):  # warm: every code path has run
        step()
    if traced:
        _check_traced(added - len(running))
    from _callgrind import ready

    ready()
    for _ in range(steps):
        step()
    os._exit(0)  # skip the interpreter's teardown: its instructions would not cancel out


def _step_outputs(running: dict[str, int], engine_records: set[str], first_headers: dict[str, str] | None,
                  final_headers: dict[str, str] | None, now: float) -> list[Any]:
    """One step's outputs: a token for each running request (*running*: tokens sent so far, updated
    here); the engine's summaries only on the requests it keeps a record of."""
    from vllm.v1.engine import EngineCoreOutput, FinishReason

    outputs = []
    for request_id, before in list(running.items()):
        sent = before + 1
        token = 3 + (sent * 7 + len(request_id)) % 250
        recorded = request_id in engine_records
        if sent == OUTPUT_TOKENS:
            outputs.append(EngineCoreOutput(request_id, [token], finish_reason=FinishReason.LENGTH,
                                            trace_headers=final_headers if recorded else None))
            del running[request_id]
            engine_records.discard(request_id)
            continue
        running[request_id] = sent
        if sent == 1:
            outputs.append(_first_output(request_id, token, first_headers if recorded else None, now))
        else:
            outputs.append(EngineCoreOutput(request_id, [token]))
    return outputs


def _first_output(request_id: str, token: int, trace_headers: dict[str, str] | None, now: float) -> Any:
    """A request's first output as EngineCore sends it with its stats on: its queue and schedule
    events (1 ms apart) and its prefill's stats (nothing cached)."""
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput
    from vllm.v1.metrics.stats import PrefillStats

    prefill = PrefillStats()
    prefill.set(num_prompt_tokens=PROMPT_TOKENS, num_local_cached_tokens=0, num_external_cached_tokens=0)
    return EngineCoreOutput(request_id, [token], trace_headers=trace_headers, prefill_stats=prefill,
                            events=[EngineCoreEvent(EngineCoreEventType.QUEUED, now - 0.003),
                                    EngineCoreEvent(EngineCoreEventType.SCHEDULED, now - 0.002)])


def _check_traced(finished: int) -> None:
    """The hooks did their work in the warm-up: every finished request closed, none failed."""
    from llmtrace._safety import error_counts
    from llmtrace.integrations.vllm._api import API

    if error_counts() or len(API.open) != RUNNING or not API.engine_reports or finished < RUNNING:
        raise SystemExit(f"the adapter did not trace the warm-up: errors {error_counts()}, "
                         f"{len(API.open)} open, engine summaries read: {API.engine_reports}")


def main() -> int:
    from _callgrind import chosen_arms, per_request, print_ratios, step_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    step_arguments(parser, ARMS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.model)
        return 0
    arms = chosen_arms(parser, args.arms, ARMS)

    from tests.vllm.tiny_model import build

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build(Path(tmp, "model")))
        counted = per_request(lambda arm, count: [sys.executable, os.path.abspath(__file__), "--child", arm,
                                                  "--steps", str(count), "--model", model],
                              arms, args.steps, args.base, jobs=args.jobs, unit="step", from_ready=True)
    print_ratios(counted, f"API server, one step's outputs for {RUNNING} running requests of {OUTPUT_TOKENS} "
                          f"output tokens (callgrind, {args.steps} - {args.base} steps)", "API thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
