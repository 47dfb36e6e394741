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
from llmtrace.load.prompts import Calibration, PromptMaker, fit_calibration


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


def test_prompts_are_sized_by_the_calibration_and_share_only_their_blocks() -> None:
    calibration = fit_calibration([(16, 16 * 2 + 7), (64, 64 * 2 + 7)])  # 2 tokens a word, a 7-token template
    assert Calibration(2.0, 7.0, True) == calibration
    maker = PromptMaker(calibration)
    assert 96 == len(maker.prompt(0, 7 + 2 * 96).split())
    a, b = maker.prompt(1, 1000, (5,)), maker.prompt(2, 1000, (5,))
    block_words = 256  # 512 tokens at 2 tokens a word
    assert a.split()[:block_words] == b.split()[:block_words]
    assert a.split()[block_words] != b.split()[block_words]
    assert Calibration() == fit_calibration([(16, 5), (64, 5)])  # a server that ignores the prompt


def test_a_smaller_prefix_block_shares_fewer_words() -> None:
    """--prefix-block-tokens 32 at 2 tokens a word: 16 shared words, then the request's own."""
    maker = PromptMaker(Calibration(2.0, 0.0, True), block_tokens=32)
    a, b = maker.prompt(1, 100, (3,)), maker.prompt(2, 100, (3,))
    assert a.split()[:16] == b.split()[:16]
    assert a.split()[16] != b.split()[16]
    with pytest.raises(ValueError, match="must be positive"):
        PromptMaker(Calibration(), block_tokens=0)
