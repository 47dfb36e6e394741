"""The load driver against a real FastAPI SSE server on loopback: schedule accuracy, no
coordinated omission, closed loop, chaos, both endpoints' wire formats.

Runs in this process with tracing off (one global TracerProvider per process: the traced
runs are in test_cli.py and test_reference_server.py, in subprocesses)."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llmtrace.load.arrivals import Lengths, make_steps, plan_open_loop
from llmtrace.load.client import Target
from llmtrace.load.live import Tally
from llmtrace.load.model import Chaos, Outcome, PlannedRequest, Step
from llmtrace.load.runner import LoadSpec, run_load, until
from tests.helpers.servers import uvicorn_server
from tests.load.sse_app import build_app, sent_by_the_load


@pytest.fixture
def sse_server() -> Iterator[tuple[str, Any]]:
    app = build_app()
    with uvicorn_server(app) as url:
        yield url, app


def _spec(url: str, planned: list[PlannedRequest], steps: tuple[Step, ...] | None = None, **kw: Any) -> LoadSpec:
    span = max(p.at_s for p in planned) + 1e-3
    return LoadSpec(target=Target(url, **kw.pop("target", {})), profile="steady",
                    steps=steps or (Step(0, 0.0, span, qps=len(planned) / span),), planned=tuple(planned),
                    traces=False, **kw)


def test_open_loop_requests_arrive_on_schedule(sse_server: tuple[str, Any]) -> None:
    """A constant 20/s schedule: each request reaches the server at its planned offset from the
    first one (within a tolerance for a shared 2-core machine), and no request is lost."""
    url, app = sse_server
    steps = make_steps([20.0], 1.5, closed_loop=False)
    planned = plan_open_loop(steps, Lengths(8, 4, "fixed"), rng=random.Random(0), arrival="constant")
    run = run_load(_spec(url, planned, steps), live=False)
    arrivals = [r.at for r in sent_by_the_load(app.state.log)]
    assert len(planned) == len(arrivals) == len(run.results)
    assert all(r.send_lag_s >= 0 for r in run.results)  # never sent before its time
    first = arrivals[0]
    errors = sorted(abs((at - first) - (p.at_s - planned[0].at_s)) for at, p in zip(arrivals, planned, strict=True))
    assert errors[len(errors) // 2] < 0.02, errors  # median error
    assert errors[-1] < 0.15, errors


def test_a_send_is_never_early_and_a_long_wait_is_slept_not_spun() -> None:
    """until() returns at or after its time, also for waits under a timer's millisecond; of a
    100 ms wait only the last stretch yields to the loop, so it costs a small part of the CPU a
    busy wait would (no wall-clock bound asserted)."""
    async def waits() -> float:
        loop = asyncio.get_running_loop()
        for ahead in (-0.001, 0.0, 0.0003, 0.002, 0.02):
            when = loop.time() + ahead
            await until(when)
            assert loop.time() >= when
        cpu = time.process_time()
        await until(loop.time() + 0.1)
        return time.process_time() - cpu

    assert asyncio.run(waits()) < 0.05


def _words_of_two_tokens(prompt: str) -> int:
    """A 5-token template, and words of four letters or more are two tokens."""
    return 5 + sum(2 if len(word) >= 4 else 1 for word in prompt.split())


def _not_word_by_word(prompt: str) -> int:
    """One token a word, and one more every ten words: counts that do not add up word by word."""
    words = len(prompt.split())
    return 5 + words + words // 10


@pytest.mark.parametrize(("count", "warning"), [(_words_of_two_tokens, None),
                                                (lambda prompt: None, "no usable usage.prompt_tokens"),
                                                (_not_word_by_word, "prompt lengths are approximate")])
def test_prompts_are_sized_by_the_servers_own_count_or_a_warning_says_why_not(
        sse_server: tuple[str, Any], count: Any, warning: str | None) -> None:
    """The preflight learns each prompt piece's cost from usage.prompt_tokens: where the server
    counts word by word, every prompt comes to exactly the length asked for (block included);
    where it reports no usage, or its counts do not add up, the run says so."""
    url, app = sse_server
    app.state.count_tokens = count
    planned = [PlannedRequest(at_s=0.01 * i, input_tokens=tokens, output_tokens=2, prefix_blocks=blocks)
               for i, (tokens, blocks) in enumerate([(20, ()), (97, ()), (300, (1,))])]
    run = run_load(_spec(url, planned, prefix_block_tokens=64), live=False)
    assert all(Outcome.OK is r.outcome for r in run.results)
    if warning is None:
        assert () == run.warnings
        assert [20, 97, 300] == [r.prompt_tokens for r in run.results]
    else:
        assert 1 == len(run.warnings) and warning in run.warnings[0], run.warnings


def test_a_stalled_server_shows_in_every_request_scheduled_during_the_stall(sse_server: tuple[str, Any]) -> None:
    """No coordinated omission: from the 5th request on the server holds every request for 2 s.
    The requests scheduled in the stall are still sent on time, and each one's latency (from its
    intended send time) covers the rest of the stall — also through a one-connection pool, where
    the client itself must queue them."""
    url, app = sse_server
    app.state.stall_at, app.state.stall_s = 3 + 5, 2.0  # the preflight's 3 requests come first
    planned = [PlannedRequest(at_s=i * 0.1, input_tokens=8, output_tokens=2) for i in range(30)]
    run = run_load(_spec(url, planned, max_connections=1), live=False)
    assert all(Outcome.OK is r.outcome for r in run.results)
    stall_end = planned[4].at_s + 2.0
    during = [r for r in run.results if planned[4].at_s <= r.scheduled_s < stall_end - 0.3]
    assert len(during) >= 10
    for r in during:
        assert r.e2e_s is not None
        assert r.e2e_s >= (stall_end - r.scheduled_s) - 0.25, (r.scheduled_s, r.e2e_s)
    # Behind the one connection, the client's own queue is measured as such (never the server's).
    assert sum(1 for r in during if r.pool_wait_s > 0.2) >= len(during) - 2, [r.pool_wait_s for r in during]


def test_closed_loop_keeps_n_clients_busy(sse_server: tuple[str, Any]) -> None:
    """--concurrency 3: never more than three requests open at once, and every one finished."""
    url, app = sse_server
    app.state.token_delay_s = 0.01
    steps = make_steps([3.0], 1.0, closed_loop=True)
    spec = LoadSpec(target=Target(url), profile="steady", steps=steps, lengths=Lengths(8, 5, "fixed"), traces=False)
    run = run_load(spec, live=False)
    assert len(run.results) >= 6
    assert all(Outcome.OK is r.outcome and 5 == r.output_tokens for r in run.results)
    opened = sorted((r.scheduled_s, r.scheduled_s + (r.e2e_s or 0.0)) for r in run.results)
    most_open = max(sum(1 for s, e in opened if s <= start < e) for start, _ in opened)
    assert most_open <= 3


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_both_endpoints_stream_measures_ttft_tpot_and_usage(sse_server: tuple[str, Any], endpoint: str) -> None:
    """The role-only first chat delta is not a token; usage from the final chunk is read."""
    url, app = sse_server
    app.state.token_delay_s = 0.005
    planned = [PlannedRequest(at_s=0.05 * i, input_tokens=12, output_tokens=6) for i in range(4)]
    run = run_load(_spec(url, planned, target={"endpoint": endpoint}), live=False)
    for r in run.results:
        assert Outcome.OK is r.outcome
        assert 6 == r.output_tokens
        assert r.prompt_tokens is not None and r.prompt_tokens > 0
        assert 5 == len(r.itl_s)
        assert r.ttft_s is not None and r.tpot_s is not None and r.e2e_s is not None
        assert 0 < r.ttft_s <= r.e2e_s


def test_non_streamed_requests_have_e2e_and_no_ttft(sse_server: tuple[str, Any]) -> None:
    url, _ = sse_server
    planned = [PlannedRequest(at_s=0.0, input_tokens=12, output_tokens=6)]
    run = run_load(_spec(url, planned, target={"stream": False}), live=False)
    (result,) = run.results
    assert (Outcome.OK, 6, None) == (result.outcome, result.output_tokens, result.ttft_s)
    assert result.e2e_s is not None


def test_chaos_clients_are_counted_as_chaos_not_as_server_errors(sse_server: tuple[str, Any]) -> None:
    """Every third request misbehaves (hang-up, malformed body, slow reader): all three kinds
    end as chaos; the well-behaved ones succeed; the run has no server error."""
    url, _ = sse_server
    kinds = [Chaos.DISCONNECT, Chaos.MALFORMED, Chaos.SLOW_READER]
    planned = [PlannedRequest(at_s=0.05 * i, input_tokens=8, output_tokens=8,
                              chaos=kinds[i // 3 % 3] if i % 3 == 0 else None) for i in range(18)]
    run = run_load(_spec(url, planned), live=False)
    chaos = [r for r in run.results if r.chaos is not None]
    assert 6 == len(chaos)
    assert all(Outcome.CHAOS is r.outcome for r in chaos)
    assert {400} == {r.status for r in chaos if r.chaos is Chaos.MALFORMED}
    assert all(Outcome.OK is r.outcome for r in run.results if r.chaos is None)
    assert not any(r.counts_as_server_error for r in run.results)


def test_worker_processes_share_one_schedule(sse_server: tuple[str, Any]) -> None:
    """--processes 2: every planned request is sent exactly once, on the one shared schedule."""
    url, app = sse_server
    planned = [PlannedRequest(at_s=0.05 * i, input_tokens=8, output_tokens=3) for i in range(20)]
    run = run_load(_spec(url, planned, processes=2), live=False)
    assert list(range(20)) == [r.index for r in run.results]
    assert all(Outcome.OK is r.outcome for r in run.results)
    assert 2 == run.self_check.processes
    arrivals = sorted(r.at for r in sent_by_the_load(app.state.log))
    assert 20 == len(arrivals)
    assert arrivals[-1] - arrivals[0] == pytest.approx(0.95, abs=0.15)


def test_the_live_line_is_redrawn_while_a_stalled_server_holds_every_request(
        sse_server: tuple[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Progress is drawn on a timer, not on sends: three requests held 2 s by the server show as
    in flight in several frames, and the last frame counts them done."""
    url, app = sse_server
    app.state.stall_at, app.state.stall_s = 3 + 1, 2.0  # after the preflight's 3 requests
    planned = [PlannedRequest(at_s=0.01 * i, input_tokens=8, output_tokens=2) for i in range(3)]
    run_load(_spec(url, planned), live=True)
    frames = [f for f in capsys.readouterr().err.split("\r\033[K") if f.strip()]
    assert len([f for f in frames if "sent 3, in flight 3 | ok 0" in f]) >= 2, frames
    assert re.search(r"sent 3, in flight 0 \| ok 3, errors 0, chaos 0 \| ttft p50 \d+ ms", frames[-1]), frames


def test_worker_progress_snapshots_merge_into_one_tally() -> None:
    """--processes: the parent's line sums the workers' counts; its TTFT is their medians'."""
    a, b = Tally(sent=5, done=4, ok=3, errors=1, recent_ttft=[0.1, 0.3, 0.2]), Tally(sent=2, done=2, chaos=2)
    merged = Tally.merged([a.snapshot(), b.snapshot()])
    assert (7, 6, 3, 1, 2, [0.2]) == (merged.sent, merged.done, merged.ok, merged.errors, merged.chaos,
                                      merged.recent_ttft)
