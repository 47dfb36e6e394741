"""The span builder's thread: every job runs without a flush, in order, and a steady stream of
records does not wake the thread once per batch (each wake-up is an ``Event.set`` on a serving
thread)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from llmtrace.lifecycle.builder import BATCH_S, SpanBuilder


class _CountingEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def _has(items: list[int], count: int) -> bool:
    return len(items) == count


def test_jobs_run_in_order_without_a_flush_also_after_the_thread_went_to_sleep() -> None:
    builder = SpanBuilder()
    ran: list[int] = []
    try:
        for round_ in range(3):
            for i in range(5):
                builder.submit(functools.partial(ran.append, round_ * 5 + i))
            assert _wait_for(functools.partial(_has, ran, (round_ + 1) * 5)), ran  # a lost wake-up never runs them
            assert _wait_for(lambda: not builder._awake)  # idle: asleep again, woken by the next round
        assert list(range(15)) == ran
    finally:
        builder.stop()
    assert builder._thread is None


def test_a_steady_stream_of_records_does_not_wake_the_thread_per_batch() -> None:
    builder = SpanBuilder()
    wake = builder._wake = _CountingEvent()
    ran: list[int] = []
    try:
        records = 40
        for i in range(records):  # one record every BATCH_S / 5: the thread never finds a round empty
            builder.submit(functools.partial(ran.append, i))
            time.sleep(BATCH_S / 5)
        assert builder.flush()
        assert list(range(records)) == ran
        # Eight batches' worth of records; woken once, plus once more for each stall of this
        # thread longer than a batch on a busy host. Waking per batch would be ~8.
        assert wake.sets <= 3, wake.sets
    finally:
        builder.stop()


def test_records_from_many_threads_all_run_while_the_thread_sleeps_and_wakes() -> None:
    builder = SpanBuilder()
    counter = [0]
    lock = threading.Lock()

    def job() -> None:
        with lock:
            counter[0] += 1

    def producer(seed: int) -> None:
        for i in range(200):
            builder.submit(job)
            if (i + seed) % 37 == 0:
                time.sleep(BATCH_S * 1.5)  # long enough for the thread to go back to sleep

    try:
        threads = [threading.Thread(target=producer, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _wait_for(lambda: counter[0] == 800), counter  # without a flush: no record waits for a wake-up forever
    finally:
        builder.stop()


def test_the_batching_pause_is_a_twentieth_of_the_span_export_interval(runtime_with: Any) -> None:
    """A record submitted to a sleeping builder runs after the batching pause, which follows
    ``span_export_interval_s``: 0.05 s at the default 1 s; 0.5 s at 10 s (a span waits up to the
    interval in the export queue anyway)."""
    waited = {}
    for interval in (1.0, 10.0):
        runtime_with(span_export_interval_s=interval)
        builder = SpanBuilder()
        done = threading.Event()
        start = time.monotonic()
        builder.submit(done.set)
        assert done.wait(10)
        waited[interval] = time.monotonic() - start
        builder.stop(5)
    assert BATCH_S <= waited[1.0] < waited[10.0] and 0.5 <= waited[10.0]
