"""Profiles as schedules: levels, steps, bursts, long-tail lengths, chaos spread, prompt sizing."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from llmtrace.errors import LLMTraceError
from llmtrace.load.arrivals import (
    Burst,
    Lengths,
    assign_chaos,
    make_steps,
    parse_chaos_kinds,
    parse_levels,
    plan_open_loop,
)
from llmtrace.load.model import Chaos, PlannedRequest
from llmtrace.load.prompts import PIECES, Calibration, PromptMaker, fit_calibration


def test_levels_parse_lists_and_doubling_ranges() -> None:
    assert [1, 2, 4, 8, 16, 32, 64] == parse_levels("1:64", integer=True)
    assert [0.5, 1.0, 2.0] == parse_levels("0.5:2", integer=False)
    assert [1, 3, 9] == parse_levels("1,3,9", integer=True)
    for bad, message in (("0:4", "not a level list"), ("a,b", "not a level list"), ("1.5", "whole numbers"),
                         ("-1", "positive")):
        with pytest.raises(LLMTraceError, match=message):
            parse_levels(bad, integer=True)


def test_steps_schedule_each_level_in_its_own_window() -> None:
    steps = make_steps([2.0, 8.0], 10.0, closed_loop=False)
    plan = plan_open_loop(steps, Lengths(10, 10), rng=random.Random(1), arrival="constant")
    assert [20, 80] == [sum(1 for p in plan if p.step == s.index) for s in steps]
    assert all(s.start_s <= p.at_s < s.start_s + s.duration_s for s in steps for p in plan if p.step == s.index)
    assert ["qps=2", "qps=8"] == [s.label for s in steps]
    assert ["concurrency=4"] == [s.label for s in make_steps([4.0], 5.0, closed_loop=True)]


def test_a_burst_adds_requests_at_one_instant() -> None:
    steps = make_steps([1.0], 20.0, closed_loop=False)
    plan = plan_open_loop(steps, Lengths(10, 10), rng=random.Random(1), arrival="constant", burst=Burst(15, 10.0))
    times = [p.at_s for p in plan]
    assert 20 + 2 * 15 == len(plan)
    assert {5.0, 15.0} == {t for t in times if times.count(t) == 15 + 1}  # the burst plus the steady request


def test_long_tail_lengths_have_a_heavy_tail_within_the_caps() -> None:
    rng = random.Random(3)
    draws = [Lengths(100, 50, "long-tail", max_input_tokens=5000).draw(rng)[0] for _ in range(4000)]
    p99 = sorted(draws)[int(0.99 * len(draws))]
    assert 80 < statistics.median(draws) < 125
    assert p99 > 6 * statistics.median(draws)
    assert max(draws) <= 5000
    assert {64} == {Lengths(64, 8, "fixed").draw(rng)[0] for _ in range(10)}


def test_chaos_is_spread_evenly_over_the_schedule_in_turn() -> None:
    plan = [PlannedRequest(at_s=float(i), input_tokens=1, output_tokens=1) for i in range(100)]
    marked = assign_chaos(plan, 0.1, (Chaos.DISCONNECT, Chaos.SLOW_READER))
    chaos = [(i, p.chaos) for i, p in enumerate(marked) if p.chaos]
    assert 10 == len(chaos)
    assert [Chaos.DISCONNECT, Chaos.SLOW_READER] * 5 == [c for _, c in chaos]
    assert all(9 <= b - a <= 11 for (a, _), (b, _) in itertools.pairwise(chaos))
    assert (Chaos.MALFORMED,) == parse_chaos_kinds("malformed")
    with pytest.raises(LLMTraceError, match="each must be one of"):
        parse_chaos_kinds("explode")


def test_uncalibrated_prompts_are_one_token_a_word_and_share_only_their_blocks() -> None:
    """Lead word, the blocks that fit, the index in spaced digits, then words of the request's own."""
    maker = PromptMaker(Calibration(), block_tokens=32)
    assert ["the", "4", "2"] == maker.prompt(42, 10).split()[:3]
    assert 10 == len(maker.prompt(42, 10).split())
    a, b = maker.prompt(1, 100, (3,)), maker.prompt(2, 100, (3,))
    assert 1 + 32 + 1 + 66 == len(a.split()) == len(b.split())
    assert a.split()[:33] == b.split()[:33]
    assert a.split()[33:35] == ["1", a.split()[34]] and b.split()[33] == "2"
    assert 1 + 1 + 8 == len(maker.prompt(1, 10, (3,)).split())  # a block that does not fit is left out
    with pytest.raises(ValueError, match="must be positive"):
        PromptMaker(Calibration(), block_tokens=0)


def test_prompts_add_up_to_the_asked_count_with_words_of_several_tokens() -> None:
    """With pieces of 1-4 tokens (a small-vocabulary tokenizer) every length from the floor (lead
    word and index) up is met exactly, blocks included."""
    costs = tuple(1 + i % 4 for i in range(len(PIECES)))
    calibration = fit_calibration(3, [3 + c for c in costs])
    assert Calibration(3, costs, True) == calibration
    cost = dict(zip(PIECES, costs, strict=True))
    maker = PromptMaker(calibration, block_tokens=40)

    def counted(prompt: str) -> int:
        return 3 + sum(cost[w] for w in prompt.split()[1:])

    for index, tokens, blocks in ((0, 8, ()), (7, 9, ()), (123, 32, ()), (5, 500, (1, 2)), (6, 41, (1,)),
                                  (99, 4000, (9,))):
        assert tokens == counted(maker.prompt(index, tokens, blocks)), (index, tokens)
    a, b = maker.prompt(8, 200, (1, 2)).split(), maker.prompt(9, 300, (1, 2)).split()
    shared = a.index("8")  # pool words are never digits: the first digit starts the index
    assert (a[:shared], "9") == (b[:shared], b[shared])
    assert 3 + 2 * 40 == counted(" ".join(a[:shared]))
    assert Calibration() == fit_calibration(3, [3] * len(PIECES))  # a server that ignores the prompt
    assert Calibration() == fit_calibration(3, [4] * 3)  # not one count per piece
