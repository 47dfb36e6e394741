"""The compiled sweeps of gpu_idle.iter_gaps (native/src/gpu_idle.rs) against the Python
oracle (``_oracle.classify_gaps``), on random engines: jittered and overlapping step children (the full priority
sweep), gc pauses inside and across host spans and tokenize spans (painting around), step
attributes and requests (work waiting)."""

from __future__ import annotations

import random

import pytest

from llmtrace.analysis import gpu_idle
from llmtrace.analysis._kernels import KERNELS, PYTHON
from llmtrace.analysis.build import build_traceset
from llmtrace.analysis.model import Gap
from tests.analysis.builders import engine_window, random_engine

pytestmark = pytest.mark.skipif(
    not KERNELS.compiled, reason="llmtrace-native not built (needs cargo: pip install ./native)"
)


@pytest.mark.parametrize("seed", range(80))
def test_compiled_and_python_sweeps_agree(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = build_traceset(random_engine(random.Random(seed)))
    engine = ts.engines["dp0"]
    monkeypatch.setattr(gpu_idle, "KERNELS", KERNELS)
    compiled = gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    monkeypatch.setattr(gpu_idle, "KERNELS", PYTHON)
    python = gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    assert compiled == python
    assert [type(g) for g in compiled[1]] == [Gap] * len(python[1])


def test_times_beyond_int64_fall_back_to_the_python_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generic decoder accepts any integer time; the compiled sweeps take int64 only."""
    far = 2**63 // 1_000_000  # ms: beyond int64 once builders.span converts to ns
    ts = build_traceset(engine_window("dp0", [(far, far + 1.0, far + 9.0, far + 10.0)]))
    engine = ts.engines["dp0"]
    monkeypatch.setattr(gpu_idle, "KERNELS", KERNELS)
    compiled = gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    monkeypatch.setattr(gpu_idle, "KERNELS", PYTHON)
    assert compiled == gpu_idle.iter_gaps(engine, ts.requests, ts.tokenize)
    assert compiled[0][0][0] > 2**63
