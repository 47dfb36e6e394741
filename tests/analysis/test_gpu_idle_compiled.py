"""The compiled sweeps of gpu_idle.iter_gaps (native/src/gpu_idle.rs) against the Python
reference, on random engines: jittered and overlapping step children (the full priority
sweep), gc pauses inside and across host spans and tokenize spans (painting around), step
attributes and requests (work waiting)."""

from __future__ import annotations

import random

import pytest

from llmtrace import semconv as sc
from llmtrace.analysis import gpu_idle
from llmtrace.analysis.build import build_traceset
from tests.analysis.builders import engine_window, request_trace, span

COMPILED = gpu_idle._compiled_classify_gaps()
pytestmark = pytest.mark.skipif(
    COMPILED is None, reason="llmtrace-native not built (needs cargo: pip install ./native)"
)


def _random_engine(rng: random.Random) -> list:  # type: ignore[type-arg]
    """Steps with jittered, sometimes overlapping or out-of-order children, gc pauses inside
    and across host spans, tokenize spans and requests: every branch of the sweeps."""
    steps = []
    t = 0.0
    for _ in range(rng.randint(1, 40)):
        a = t + rng.choice([0.0, 0.0, rng.uniform(0, 5)])
        b = a + rng.uniform(0, 2)
        c = b + rng.choice([0.0, rng.uniform(0, 9)])
        d = c + rng.uniform(0, 2)
        if rng.random() < 0.1:  # a child that overlaps its neighbour: the full sweep
            b, c = c, b
        steps.append((a, min(b, c), max(b, c), d))
        t = d + rng.choice([-0.5, 0.0, rng.uniform(0, 4)]) if rng.random() < 0.9 else d
    end = steps[-1][3]
    gc = [(x, x + rng.uniform(0, 3)) for x in sorted(rng.uniform(0, end) for _ in range(rng.randint(0, 4)))]
    attrs = [{sc.LLM_QUEUE_WAITING: rng.choice([0, 0, 2]), sc.LLM_BATCH_SIZE: rng.choice([0, 1, 3])} for _ in steps]
    spans = engine_window("dp0", steps, gc=gc, per_step_attrs=attrs)
    for _ in range(rng.randint(0, 3)):
        x = rng.uniform(-2, end)
        spans.append(span(sc.SPAN_TOKENIZE, x, x + rng.uniform(0, 5), trace=f"{rng.getrandbits(128):032x}"))
    for _ in range(rng.randint(0, 3)):
        x = rng.uniform(0, end)
        spans += request_trace(f"{rng.getrandbits(128):032x}", x, 0, rng.uniform(0, 3), rng.uniform(0, 9), 1.0)
    return spans


@pytest.mark.parametrize("seed", range(80))
def test_compiled_and_python_sweeps_agree(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = build_traceset(_random_engine(random.Random(seed)))
    engine = ts.engines["dp0"]
    monkeypatch.setattr(gpu_idle, "_native_classify_gaps", COMPILED)
    compiled = gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    monkeypatch.setattr(gpu_idle, "_native_classify_gaps", None)
    python = gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    assert compiled == python
    assert [type(g) for g in compiled[1]] == [gpu_idle.Gap] * len(python[1])


def test_times_beyond_int64_fall_back_to_the_python_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generic decoder accepts any integer time; the compiled sweeps take int64 only."""
    far = 2**63 // 1_000_000  # ms: beyond int64 once builders.span converts to ns
    ts = build_traceset(engine_window("dp0", [(far, far + 1.0, far + 9.0, far + 10.0)]))
    engine = ts.engines["dp0"]
    monkeypatch.setattr(gpu_idle, "_native_classify_gaps", COMPILED)
    compiled = gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    monkeypatch.setattr(gpu_idle, "_native_classify_gaps", None)
    assert compiled == gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    assert compiled[0][0][0] > 2**63
