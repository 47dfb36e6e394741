"""The reference engine's paged KV-cache blocks, with prefix caching (pure logic, no torch).

Blocks are accounting, as the rest of the reference engine's KV cache is (it recomputes the
sequence each step): what they model is how a paged cache admits, shares and evicts, the way
vLLM's block manager does, so that load shows real admission limits, preemptions and
prefix-cache hits and misses.

* A sequence holds ``ceil(tokens / block_size)`` blocks.
* **Prefix caching.** Every *full* block of a prompt is named by a hash chained over the
  blocks before it (``hash(previous, tokens of this block)``), so two prompts share block *i*
  only if they agree on everything up to its end. At admission the prompt's leading blocks
  already in the cache are reused (their tokens are not computed again); the rest are
  allocated, and the prompt's full blocks are registered for the next request. At least one
  prompt token is always computed (the last block of a fully cached prompt is recomputed),
  as in vLLM: the engine needs the last position's logits.
* A cached block stays cached when its last user ends; with no user it is *evictable*, and
  free capacity is the free blocks plus the evictable ones. Allocation takes free blocks
  first, then evicts the least recently used evictable block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

_ROOT_HASH = 0x9E3779B97F4A7C15


@dataclass
class _Holding:
    """The blocks one sequence holds: cached (shared, by hash) and private (count)."""

    cached: list[int] = field(default_factory=list)
    private: int = 0

    @property
    def blocks(self) -> int:
        return len(self.cached) + self.private


class BlockManager:
    def __init__(self, total_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if total_blocks < 1 or block_size < 1:
            raise ValueError("total_blocks and block_size must be positive")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._free = total_blocks  # neither held nor cached
        self._users: dict[int, int] = {}  # cached block hash -> sequences holding it
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, no user; oldest first
        self._held: dict[str, _Holding] = {}

    # ------------------------------------------------------------------ queries
    @property
    def free_capacity(self) -> int:
        """Blocks an allocation can get: free ones plus evictable cached ones."""
        return self._free + len(self._evictable)

    @property
    def usage(self) -> float:
        """Share of blocks held by running sequences (cached-but-unused blocks count as free)."""
        return 1.0 - self.free_capacity / self.total_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def held(self, seq_id: str) -> int:
        holding = self._held.get(seq_id)
        return holding.blocks if holding is not None else 0

    def prompt_hashes(self, prompt: list[int]) -> list[int]:
        """The chained hashes of the prompt's full blocks."""
        hashes, previous = [], _ROOT_HASH
        for start in range(0, len(prompt) - self.block_size + 1, self.block_size):
            previous = hash((previous, tuple(prompt[start:start + self.block_size])))
            hashes.append(previous)
        return hashes

    # ------------------------------------------------------------------ changes
    def admit(self, seq_id: str, prompt: list[int], tokens: int) -> int | None:
        """Give a sequence of *prompt* room for *tokens* tokens, reusing the cached blocks its
        prompt starts with. Returns the prompt tokens served from the cache, or None (and
        changes nothing) when the blocks do not fit."""
        if seq_id in self._held:
            raise ValueError(f"sequence {seq_id} already holds blocks")
        hashes = self.prompt_hashes(prompt) if self.prefix_caching else []
        hit = 0
        while hit < len(hashes) and hashes[hit] in self._users:
            hit += 1
        hit = min(hit, (len(prompt) - 1) // self.block_size)  # compute at least one token
        needed = self.blocks_for(tokens) - hit
        reusable_evictable = sum(1 for h in hashes[:hit] if self._users[h] == 0)
        if needed > self.free_capacity - reusable_evictable:
            return None
        holding = _Holding()
        for h in hashes[:hit]:
            self._use(h)
            holding.cached.append(h)
        # The prompt's other full blocks are computed now and cached for later requests.
        for h in hashes[hit:]:
            if needed == 0:
                break
            self._take_block()
            if h in self._users:
                # Cached already, but past a block this prompt computes (an earlier block of its
                # chain was evicted) or the last block of a wholly cached prompt (recomputed): a
                # block of its own, private.
                holding.private += 1
            else:
                self._users[h] = 1
                holding.cached.append(h)
            needed -= 1
        for _ in range(needed):
            self._take_block()
            holding.private += 1
        self._held[seq_id] = holding
        return hit * self.block_size

    def grow(self, seq_id: str, tokens: int) -> bool:
        """Room for *tokens* tokens in all; False (nothing changes) when the blocks do not fit."""
        holding = self._held[seq_id]
        needed = self.blocks_for(tokens) - holding.blocks
        if needed <= 0:
            return True
        if needed > self.free_capacity:
            return False
        for _ in range(needed):
            self._take_block()
        holding.private += needed
        return True

    def release(self, seq_id: str) -> None:
        """The sequence ended or was preempted: its private blocks are freed, its cached blocks
        stay cached (evictable once nobody holds them)."""
        holding = self._held.pop(seq_id, None)
        if holding is None:
            return
        self._free += holding.private
        for h in holding.cached:
            users = self._users[h] - 1
            self._users[h] = users
            if users == 0:
                self._evictable[h] = None

    # ------------------------------------------------------------------ internals
    def _use(self, block_hash: int) -> None:
        if self._users[block_hash] == 0:
            del self._evictable[block_hash]
        self._users[block_hash] += 1

    def _take_block(self) -> None:
        if self._free:
            self._free -= 1
            return
        victim, _ = self._evictable.popitem(last=False)  # least recently used
        del self._users[victim]
