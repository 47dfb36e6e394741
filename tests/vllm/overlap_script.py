"""Drives vLLM's real AsyncScheduler the way EngineCore.step_with_batch_queue does: step N+1 is
scheduled before step N's output is processed. Writes spans to the file given as argv[2]."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def main(model: str, traces: str) -> None:
    import llmtrace

    llmtrace.instrument(exporter=f"file:{traces}", gpu="off", metrics=False)
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    config = EngineArgs(model=model, load_format="dummy", max_model_len=128, max_num_seqs=8,
                        max_num_batched_tokens=64, enforce_eager=True).create_engine_config()
    config.cache_config.num_gpu_blocks = 64
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0", "l1"], spec)])
    scheduler = AsyncScheduler(vllm_config=config, kv_cache_config=kv,
                               structured_output_manager=StructuredOutputManager(config), block_size=16)
    for i in range(4):
        scheduler.add_request(Request(f"q{i}", list(range(3, 23)), SamplingParams(max_tokens=6, ignore_eos=True),
                                      None))
    in_flight = []
    for _ in range(40):
        if scheduler.has_requests():
            in_flight.append(scheduler.schedule())
        if len(in_flight) < 2 and scheduler.has_requests():
            continue  # a second batch goes out before the first one's output is processed
        if not in_flight:
            break
        output = in_flight.pop(0)
        ids = list(output.num_scheduled_tokens)
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=[[5] for _ in ids])
        scheduler.update_from_output(output, runner)
    print("FINISHED", sum(1 for r in scheduler.requests.values() if r.is_finished()), len(scheduler.requests))
    llmtrace.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
