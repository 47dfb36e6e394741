"""Async scheduling (vLLM's default on GPUs): steps overlap, and each is still one coherent llm.step."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest

from tests.vllm import trace_checks
from tests.vllm.conftest import PYTHON, REPO, driven, requires_vllm, subprocess_env

pytestmark = [pytest.mark.vllm, requires_vllm]


def test_overlapping_steps_keep_their_own_phases(tiny_model: Path, tmp_path: Path) -> None:
    """Step N+1 is scheduled before step N's output arrives: both steps overlap in time, each has
    its schedule/forward/postprocess inside it, and every request gets its engine phases."""
    traces = tmp_path / "traces.jsonl"
    done = subprocess.run([PYTHON, "-m", "tests.vllm.overlap_script", str(tiny_model), str(traces)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300, check=False)
    assert 0 == done.returncode, done.stderr[-4000:]
    driven("AsyncScheduler driven like EngineCore.step_with_batch_queue (two batches in flight)")
    spans = trace_checks.load(traces)
    # The engine owns llm.request here (no API server): no tokenize span, same engine model.
    assert [] == trace_checks.check(spans, expected_requests=4, expect_tokenize=False).problems
    steps = sorted((s for s in spans if s.name == "llm.step"), key=lambda s: s.start_ns)
    overlapping = [(a, b) for a, b in itertools.pairwise(steps) if b.start_ns < a.end_ns]
    assert overlapping, "expected overlapping llm.step spans under async scheduling"
