"""EngineCore-thread cost of the vLLM adapter per engine step, through vLLM's real Scheduler.

vLLM's own ``Scheduler`` and KV-cache manager (a real ``VllmConfig`` for a tiny Llama on the
CPU platform) fed real ``Request`` objects; each step is ``schedule()``, then
``update_from_output()`` with a ``ModelRunnerOutput`` of one token per scheduled request — what
``EngineCore.step`` does around the model runner. No model runs: what is measured is the
scheduler's Python and llmtrace's hooks on it, on the thread that runs them. Requests of 20
prompt tokens and 16 output tokens, 8 running (``--running``); each finished request is replaced
by a new one, so opening and finishing requests is in the per-step number at a 16-token stream's
rate. vLLM's request stats are on, as ``vllm serve`` has them. Requests carry what the API
server's adapter puts in their ``trace_headers``: a request sampled there (every tenth at production
settings, every one fully traced) its W3C context; an unsampled one only the mark that EngineCore
need keep no record of it (the API server takes its metrics from vLLM's own events).

Arms, each in its own process: ``untraced`` (llmtrace not imported), ``production``
(``LLMTRACE_SAMPLE_RATIO=0.1``, ``LLMTRACE_ENGINE_SAMPLE_RATIO=0.1``), ``full`` (everything
sampled); ``unsampled_windows`` and ``unsampled_windows_python`` (``--arms``) are production's
steps in unsampled windows alone, counted by llmtrace's compiled core and by its Python code
(``LLMTRACE_STEP_COUNTER=python``). Spans are built on the span builder's thread and dropped (``exporter="none"``): the
main thread's count is the engine loop's; all threads' adds the builder's.

    python benchmarks/bench_vllm_step.py                      # callgrind, instructions per step (~5 min)
    python benchmarks/bench_vllm_step.py --steps 2000 --base 400 --jobs 2
    python benchmarks/bench_vllm_step.py --running 2      # small batches: the per-step part
    python benchmarks/bench_vllm_step.py --arms untraced,unsampled_windows,unsampled_windows_python

Set-up (importing torch and vLLM) runs before callgrind starts counting (``_callgrind.ready``);
each arm's count at ``--steps`` minus its count at ``--base`` is divided by the difference.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_ARMS = ("untraced", "production", "full")
#: Production's nine steps in ten, alone: every engine window unsampled (a sampled window's share
#: otherwise swings with how many of a short run's windows the dice picked), with llmtrace's
#: compiled step counter and with its Python reference.
ARMS = (*DEFAULT_ARMS, "unsampled_windows", "unsampled_windows_python")
ARM_ENV = {"production": {"LLMTRACE_SAMPLE_RATIO": "0.1", "LLMTRACE_ENGINE_SAMPLE_RATIO": "0.1"},
           "full": {"LLMTRACE_SAMPLE_RATIO": "1", "LLMTRACE_ENGINE_SAMPLE_RATIO": "1"},
           "unsampled_windows": {"LLMTRACE_SAMPLE_RATIO": "0.1", "LLMTRACE_ENGINE_SAMPLE_RATIO": "0"},
           "unsampled_windows_python": {"LLMTRACE_SAMPLE_RATIO": "0.1", "LLMTRACE_ENGINE_SAMPLE_RATIO": "0",
                                        "LLMTRACE_STEP_COUNTER": "python"}}
PROMPT_TOKENS, OUTPUT_TOKENS = 20, 16


def child(arm: str, steps: int, model: str, no_gc: bool = False, running: int = 8) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.update(ARM_ENV.get(arm, {}))
    if arm != "untraced":
        import llmtrace

        llmtrace.instrument(exporter="none", gpu="off", metrics=False)
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    hooked = getattr(vars(Scheduler)["schedule"], "_self_llmtrace", False)
    if hooked != (arm != "untraced"):
        raise SystemExit(f"{arm}: Scheduler.schedule {'is' if hooked else 'is not'} hooked")
    config = EngineArgs(model=model, load_format="dummy", max_model_len=128, max_num_seqs=running,
                        max_num_batched_tokens=256, enforce_eager=True).create_engine_config()
    config.cache_config.num_gpu_blocks = 256
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=256, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0", "l1"], spec)])
    scheduler = Scheduler(vllm_config=config, kv_cache_config=kv,
                          structured_output_manager=StructuredOutputManager(config), block_size=16, log_stats=True)
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    added = 0
    sampled_every = {"full": 1}.get(arm, 10) if arm != "untraced" else 0
    no_record = _no_record_mark() if sampled_every else {}

    def carrier(n: int) -> dict[str, str]:
        """What the API server's adapter puts on each request: its ``llm.request``'s context, sampled
        there (one in ten at production settings), and on an unsampled one its no-record mark."""
        if sampled_every and n % sampled_every == 0:
            return {"traceparent": f"00-{n + 1:032x}-{n + 1:016x}-01"}
        return dict(no_record)  # no parent context: EngineCore keeps no record (vLLM's tracing off)

    def top_up() -> None:
        nonlocal added
        while scheduler.get_num_unfinished_requests() < running:
            # A distinct prompt per request: no prefix-cache hits, every request prefills.
            prompt = [3 + (added + i) % 250 for i in range(PROMPT_TOKENS)]
            scheduler.add_request(Request(f"r{added}", prompt, params, None, trace_headers=carrier(added)))
            added += 1

    def step() -> None:
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=[[5] for _ in ids])
        scheduler.update_from_output(output, runner)
        top_up()

    top_up()
    for _ in range(200):  # warm: every code path has run, the first windows are closed
        step()
    if arm != "untraced":
        _check_traced(arm)
    from _callgrind import ready

    if no_gc:
        gc.disable()
    ready()
    for _ in range(steps):
        step()
    os._exit(0)  # skip the interpreter's teardown: its instructions would not cancel out


def _check_traced(arm: str) -> None:
    """The hooks ran the warm-up without an internal error (else the count would measure a failure)."""
    from llmtrace._safety import error_counts

    if error_counts():
        raise SystemExit(f"{arm}: the adapter failed in the warm-up: {error_counts()}")
    if arm.startswith("unsampled_windows"):  # the arm counts what it names: steps by the compiled core, or none
        from llmtrace.integrations.vllm import _engine

        counts = [s.counter.counted() if s.counter is not None else None for s in _engine.engine_states()]
        found = "none" if counts == [None] else ("some" if len(counts) == 1 and all(counts) else "?")
        if found != ("none" if arm.endswith("_python") else "some"):
            raise SystemExit(f"{arm}: steps counted by the compiled core in the warm-up: {counts}")


def _no_record_mark() -> dict[str, str]:
    """The mark the API server's adapter adds to an unsampled request (vLLM's stats on)."""
    from llmtrace.integrations.vllm import _constants as C  # the adapter's wire key only: no hooks, no state

    return {C.NO_ENGINE_RECORD_KEY: "1"}


def main() -> int:
    from _callgrind import chosen_arms, per_request, print_ratios, step_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    step_arguments(parser, ARMS, DEFAULT_ARMS)
    parser.add_argument("--running", type=int, default=8, help="requests in the batch (default 8)")
    parser.add_argument("--no-gc", action="store_true",
                        help="garbage collection off in the counted steps: exact, but leaves out what "
                             "llmtrace's allocations add to collections")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.model, args.no_gc, args.running)
        return 0
    arms = chosen_arms(parser, args.arms, ARMS)

    from tests.vllm.tiny_model import build

    with tempfile.TemporaryDirectory() as tmp:
        model = str(build(Path(tmp, "model")))
        counted = per_request(lambda arm, count: [sys.executable, os.path.abspath(__file__), "--child", arm,
                                                  "--steps", str(count), "--model", model,
                                                  "--running", str(args.running),
                                                  *(["--no-gc"] if args.no_gc else [])],
                              arms, args.steps, args.base, jobs=args.jobs, unit="step", from_ready=True)
    print_ratios(counted, f"engine step, {args.running} running requests of {OUTPUT_TOKENS} output tokens (callgrind, "
                          f"{args.steps} - {args.base} steps)", "engine thread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
