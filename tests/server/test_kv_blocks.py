"""The reference engine's paged blocks with prefix caching: sharing, the one-token rule,
LRU eviction under the block budget, and exact capacity accounting."""

from __future__ import annotations

from llmtrace.server.kv_blocks import BlockManager
from llmtrace.server.scheduler import Scheduler, Sequence

SYSTEM = list(range(100, 148))  # three full blocks of 16


def test_a_second_prompt_with_the_same_prefix_reuses_its_full_blocks() -> None:
    blocks = BlockManager(total_blocks=20, block_size=16)
    assert 0 == blocks.admit("a", [*SYSTEM, 1, 2, 3], 52)
    assert 48 == blocks.admit("b", [*SYSTEM, 7, 8], 51)  # the three system blocks, not the tail
    assert 4 == blocks.held("b")  # 3 shared + 1 private
    assert 20 - 4 - 1 == blocks.free_capacity  # b added one private block only


def test_prompts_that_differ_early_share_nothing_after_the_difference() -> None:
    """Hashes chain: block 2 matches only if blocks 0 and 1 did."""
    blocks = BlockManager(total_blocks=20, block_size=16)
    blocks.admit("a", [*SYSTEM, 1], 49)
    other = [0, *SYSTEM[1:], 1]  # first token differs
    assert 0 == blocks.admit("b", other, 49)


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    blocks = BlockManager(total_blocks=20, block_size=16)
    blocks.admit("a", SYSTEM, 49)
    assert 32 == blocks.admit("b", SYSTEM, 49)


def test_cached_blocks_outlive_their_sequence_and_are_evicted_oldest_first() -> None:
    """Two 3-block prefixes cached in a 6-block cache: a third prompt needs 3 blocks, so the
    least recently used prefix goes and the other still hits."""
    blocks = BlockManager(total_blocks=6, block_size=16)
    first, second, third = ([n] * 48 for n in (1, 2, 3))
    blocks.admit("a", [*first, 0], 48)
    blocks.release("a")
    blocks.admit("b", [*second, 0], 48)
    blocks.release("b")
    assert 6 == blocks.free_capacity  # cached but evictable counts as free
    blocks.admit("c", [*third, 0], 48)
    blocks.release("c")
    assert 0 == blocks.admit("d", [*first, 0], 48)  # evicted (the oldest)
    blocks.release("d")
    assert 48 == blocks.admit("e", [*third, 0], 49)  # still cached: the most recently released


def test_an_admission_that_does_not_fit_changes_nothing() -> None:
    blocks = BlockManager(total_blocks=4, block_size=16)
    assert blocks.admit("a", [1] * 40, 40) is not None
    before = blocks.free_capacity
    assert blocks.admit("b", [2] * 40, 40) is None
    assert before == blocks.free_capacity and 0 == blocks.held("b")


def test_without_prefix_caching_nothing_is_shared() -> None:
    blocks = BlockManager(total_blocks=20, block_size=16, prefix_caching=False)
    blocks.admit("a", [*SYSTEM, 1], 49)
    assert 0 == blocks.admit("b", [*SYSTEM, 1], 49)


def test_the_scheduler_reports_cached_tokens_and_computes_only_the_rest() -> None:
    scheduler = Scheduler(total_blocks=40, block_size=16)
    scheduler.add(Sequence("a", [*SYSTEM, 1, 2], max_tokens=4))
    first = scheduler.schedule()
    assert (0, 50) == (first.cached_tokens, first.prefill_tokens)
    scheduler.add(Sequence("b", [*SYSTEM, 9], max_tokens=4))
    second = scheduler.schedule()
    assert (48, 1) == (second.cached_tokens, second.prefill_tokens)
    assert {"a": 0, "b": 48} == {s.request_id: s.cached_tokens for s in second.batch}


def test_a_wholly_cached_prompt_pays_for_the_block_it_recomputes() -> None:
    """The recomputed last block is a block of its own: held while the sequence runs, free after."""
    blocks = BlockManager(total_blocks=8, block_size=16)
    blocks.admit("a", SYSTEM, 49)  # 3 cached + 1 private
    blocks.release("a")
    assert 8 == blocks.free_capacity
    assert 32 == blocks.admit("b", SYSTEM, 49)  # 2 shared, the third recomputed, 1 more for the token
    assert 4 == blocks.held("b")
    assert 8 - 4 == blocks.free_capacity  # the third system block stays cached, evictable: free
    blocks.release("b")
    assert 8 == blocks.free_capacity


def test_capacity_is_exact_through_random_admissions_growth_and_releases() -> None:
    """Shared prefixes, evictions and gaps in cached chains in every order (300 seeded runs): free
    capacity never exceeds the budget, and is the whole budget again once every sequence is gone."""
    import random

    for seed in range(300):
        rng = random.Random(seed)
        total, size = rng.randint(3, 15), rng.choice([2, 4, 16])
        blocks = BlockManager(total, size)
        prefixes = [[rng.randint(0, 3) for _ in range(rng.randint(0, 40))] for _ in range(3)]
        held: dict[str, int] = {}
        for n in range(200):
            action = rng.random()
            if action < 0.4:
                prompt = rng.choice(prefixes) + [rng.randint(0, 3) for _ in range(rng.randint(1, 20))]
                if blocks.admit(f"s{n}", prompt, len(prompt) + 1) is not None:
                    held[f"s{n}"] = len(prompt) + 1
            elif action < 0.7 and held:
                seq = rng.choice(sorted(held))
                if blocks.grow(seq, held[seq] + 1):
                    held[seq] += 1
            elif held:
                seq = rng.choice(sorted(held))
                blocks.release(seq)
                del held[seq]
            assert blocks.free_capacity <= total, seed
        for seq in held:
            blocks.release(seq)
        assert total == blocks.free_capacity, seed

