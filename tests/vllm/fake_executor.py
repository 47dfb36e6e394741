"""A vLLM ``Executor`` with no model: it lets the *real* engine (EngineCore, Scheduler,
KV-cache manager, ZMQ client, OutputProcessor) run on a machine without a GPU.

Each scheduled request gets one output token per step once its prompt is fully
computed (chunked prefill emits nothing until the last chunk), exactly the
contract of vLLM's model runner; the token id is fixed and never EOS, so
requests end by ``max_tokens`` (or a stop string, or an abort).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import torch
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import ModelRunnerOutput

TOKEN_ID = 10
#: Seconds a fake forward takes, so that steps have a measurable duration.
FORWARD_S = 0.002


class FakeWorker:
    def __init__(self, vllm_config: Any) -> None:
        self.config = vllm_config
        self.prompt_lens: dict[str, int] = {}
        self.pending: Any = None

    def get_kv_cache_spec(self) -> dict[str, Any]:
        hf = self.config.model_config.hf_config
        spec = FullAttentionSpec(block_size=self.config.cache_config.block_size,
                                 num_kv_heads=hf.num_key_value_heads,
                                 head_size=hf.hidden_size // hf.num_attention_heads, dtype=torch.float32)
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(hf.num_hidden_layers)}

    def determine_available_memory(self) -> int:
        return 64 * 1024 * 1024

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBHNC"]

    def get_simple_cpu_offload_num_blocks(self) -> None:
        return None

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def execute_model(self, scheduler_output: Any) -> None:
        time.sleep(FORWARD_S)
        self.pending = scheduler_output

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput:
        so, self.pending = self.pending, None
        if so is None:
            return ModelRunnerOutput(req_ids=[], req_id_to_index={})
        for new in so.scheduled_new_reqs:
            self.prompt_lens[new.req_id] = len(new.prompt_token_ids or ())
        computed = dict(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens,
                            strict=False))
        for new in so.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            done = computed.get(rid, 0) + so.num_scheduled_tokens[rid]
            sampled.append([TOKEN_ID] if done >= self.prompt_lens.get(rid, 0) else [])
        for rid in so.finished_req_ids:
            self.prompt_lens.pop(rid, None)
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)

    def compile_or_warm_up_model(self) -> Any:
        from vllm.v1.worker.worker_base import CompilationTimes

        return CompilationTimes(0.0, 0.0)

    def take_draft_token_ids(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        # Everything else EngineCore asks a worker at start-up (warm-up, layouts...) is a no-op.
        return lambda *args, **kwargs: None


class FakeExecutor(Executor):
    """In-process executor: ``collective_rpc`` calls the fake worker directly."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        self.worker = FakeWorker(self.vllm_config)

    def collective_rpc(self, method: Any, timeout: Any = None, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None, non_block: bool = False,
                       single_value: bool = False) -> Any:
        if isinstance(method, str):
            result = getattr(self.worker, method)(*args, **(kwargs or {}))
        else:
            result = method(self.worker, *args, **(kwargs or {}))
        value = result if single_value else [result]
        if not non_block:
            return value
        future: Future[Any] = Future()
        future.set_result(value)
        return future

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        return self.collective_rpc("execute_model", args=(scheduler_output,), non_block=non_block,
                                   single_value=True)

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
        return self.collective_rpc("sample_tokens", args=(grammar_output,), non_block=non_block,
                                   single_value=True)

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None
