"""A continuous-batching scheduler with a paged KV-cache block budget (pure logic, no torch).

Each step admits waiting requests first-come-first-served while their blocks fit,
and grows every running request by one token. When a running request needs a
new block and none is free, the most recently admitted request is preempted
(recompute mode, as vLLM does): its blocks are freed and it waits again at the
front of the queue, keeping the tokens it already produced. The blocks, and the prefix
cache that lets requests with a common prompt prefix share them, are
:class:`~llmtrace.server.kv_blocks.BlockManager`'s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from llmtrace.server.kv_blocks import BlockManager


@dataclass
class Sequence:
    """One request as the engine sees it."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    output_ids: list[int] = field(default_factory=list)
    needs_prefill: bool = True
    #: The request's own random generator (a ``torch.Generator``) when it asked for a seed.
    generator: Any = None
    #: Prompt tokens the prefix cache served at the first admission (None until admitted).
    cached_tokens: int | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass(frozen=True)
class Schedule:
    """What one step runs."""

    batch: list[Sequence]
    prefill_tokens: int
    decode_tokens: int
    preempted: list[Sequence]
    #: Prompt tokens of the sequences admitted in this step that the prefix cache served.
    cached_tokens: int = 0
    #: The sequences admitted in this step (new or back from a preemption).
    admitted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, total_blocks: int, block_size: int = 16, max_batch: int = 32,
                 max_prefill_tokens: int = 2048, prefix_caching: bool = True) -> None:
        if total_blocks < 1 or block_size < 1 or max_batch < 1:
            raise ValueError("total_blocks, block_size and max_batch must be positive")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.max_batch = max_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.blocks = BlockManager(total_blocks, block_size, prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def free_blocks(self) -> int:
        return self.blocks.free_capacity

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def add(self, seq: Sequence) -> None:
        if self.blocks_for(len(seq.prompt_ids) + seq.max_tokens) > self.total_blocks:
            raise ValueError(f"request {seq.request_id} needs more KV blocks than the engine has")
        self.waiting.append(seq)

    def remove(self, request_id: str) -> Sequence | None:
        """Drop a request wherever it is (finished or aborted) and free its blocks."""
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self._free(seq)
                return seq
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return seq
        return None

    def _free(self, seq: Sequence) -> None:
        self.blocks.release(seq.request_id)

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        return self.blocks.grow(seq.request_id, tokens)

    def _admit(self, seq: Sequence, tokens: int) -> int | None:
        """Blocks for a waiting sequence (its prompt and any output it had before a preemption);
        the cached prompt tokens, or None when it does not fit."""
        cached = self.blocks.admit(seq.request_id, seq.prompt_ids + seq.output_ids, tokens)
        if cached is not None and seq.cached_tokens is None:
            seq.cached_tokens = cached
        return cached

    def schedule(self) -> Schedule:
        preempted: list[Sequence] = []
        # Each running request needs room for one more token; preempt the newest until all fit.
        index = 0
        while index < len(self.running):
            if self._grow(self.running[index], self.running[index].length + 1):
                index += 1
                continue
            victim = self.running.pop()
            self._free(victim)
            victim.needs_prefill = True
            preempted.append(victim)
        for seq in reversed(preempted):
            self.waiting.appendleft(seq)
        prefill_tokens = cached_tokens = 0
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if prefill_tokens and prefill_tokens + seq.length > self.max_prefill_tokens:
                break
            cached = self._admit(seq, seq.length + 1)
            if cached is None:
                break
            self.waiting.popleft()
            self.running.append(seq)
            admitted.append(seq)
            prefill_tokens += seq.length - cached
            cached_tokens += cached
        decode_tokens = sum(1 for s in self.running if not s.needs_prefill)
        return Schedule(list(self.running), prefill_tokens, decode_tokens, preempted, cached_tokens, admitted)

    @property
    def kv_cache_usage(self) -> float:
        return self.blocks.usage
