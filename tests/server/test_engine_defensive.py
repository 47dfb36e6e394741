"""The engine's second line: an ``add`` message that does not describe a servable request fails
that request alone (an error output with status 400) and the engine serves on.

The engine runs in this process; its output pipe is replaced by a list (the seam: the pipe's
``send``), so that what the engine says can be read back directly.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.torch

VOCAB = 64


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)


GOOD = {"request_id": "good", "prompt_ids": [3, 4, 5], "max_tokens": 2, "temperature": 0.0, "top_p": 1.0}


@pytest.mark.parametrize("bad", [
    {"prompt_ids": []}, {"prompt_ids": [VOCAB]}, {"prompt_ids": [-1]}, {"prompt_ids": "abc"},
    {"prompt_ids": [1.5]}, {"max_tokens": 0}, {"max_tokens": 10_000}, {"max_tokens": "8"},
    {"temperature": float("nan")}, {"temperature": -1.0}, {"temperature": None}, {"top_p": 7},
    {"seed": "x"}, {"max_tokens": None},
])
def test_a_bad_add_fails_that_request_and_the_engine_serves_on(bad: dict[str, Any]) -> None:
    from llmtrace.server.engine import EngineConfig, ReferenceEngine

    outbox = Outbox()
    engine = ReferenceEngine(EngineConfig(vocab_size=VOCAB, eos_token_id=0, max_model_len=64), outbox)
    engine.handle("add", {**GOOD, "request_id": "bad", **bad})
    assert [("outputs", [], [("bad", "error")])] == [(m[0], m[1], [f[:2] for f in m[2]]) for m in outbox.sent]
    assert 400 == outbox.sent[0][2][0][2]["status"]
    engine.handle("add", GOOD)
    while engine.has_work:
        engine.step()
    finished = [f for m in outbox.sent if m[0] == "outputs" for f in m[2] if f[0] == "good"]
    assert 1 == len(finished) and finished[0][1] in ("stop", "length")


def test_a_message_without_a_request_id_is_ignored() -> None:
    from llmtrace.server.engine import EngineConfig, ReferenceEngine

    outbox = Outbox()
    engine = ReferenceEngine(EngineConfig(vocab_size=VOCAB, eos_token_id=0), outbox)
    engine.handle("add", ["not", "a", "dict"])
    engine.handle("add", {"request_id": 5})
    assert ([], False) == (outbox.sent, engine.has_work)


def test_a_gathering_engine_starts_a_wave_of_requests_as_one_batch() -> None:
    """``gather_batch=3`` (counted benchmarks): with nothing running the engine waits — blocked on
    its queue, not polling — until three requests wait, then runs them as one batch to the end."""
    import queue
    import threading

    from llmtrace.server.engine import EngineConfig, ReferenceEngine, _take_messages

    outbox = Outbox()
    engine = ReferenceEngine(EngineConfig(vocab_size=VOCAB, eos_token_id=0, gather_batch=3), outbox)
    messages: queue.Queue[tuple[str, Any]] = queue.Queue()
    messages.put(("add", {**GOOD, "request_id": "r0", "max_tokens": 4}))
    assert _take_messages(engine, messages)  # what was there, taken at once
    assert engine.gathering and not engine.has_work
    taken = threading.Thread(target=_take_messages, args=(engine, messages))
    taken.start()
    taken.join(0.5)
    assert taken.is_alive()  # one request waits: the engine waits for the next message, however long
    messages.put(("add", {**GOOD, "request_id": "r1", "max_tokens": 4}))
    taken.join(10)
    assert not taken.is_alive() and engine.gathering
    engine.handle("add", {**GOOD, "request_id": "r2", "max_tokens": 4})
    assert engine.has_work and not engine.gathering
    batches = []
    while engine.has_work:
        engine.step()
        batches.append(len(outbox.sent[-1][1]) + len(outbox.sent[-1][2]))
    finished = {f[0] for m in outbox.sent if m[0] == "outputs" for f in m[2]}
    assert 3 == batches[0] and {"r0", "r1", "r2"} == finished
    assert engine.gathering  # the wave is over: the next one is gathered the same way
