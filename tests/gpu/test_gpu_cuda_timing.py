"""CUDA-event forward timing and torch memory attributes on a CPU-only machine: no-ops
that never import torch and never initialise CUDA. Each case runs in a fresh subprocess
so that "torch imported or not" is real. (The GPU path is exercised by scripts/gpu-check.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == proc.returncode, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_without_torch_imported_everything_is_a_no_op_and_torch_stays_unimported() -> None:
    """begin() is None, resolve_ready() empty, memory attributes empty, and torch is not imported."""
    result = _run(
        """
        import json, sys
        from llmtrace.gpu.cuda_timing import ForwardTimer, cuda_in_use, torch_memory_attributes
        t = ForwardTimer()
        token = t.begin("step-1")
        t.end(token)
        print(json.dumps(dict(token=token is None, ready=t.resolve_ready(), mem=torch_memory_attributes(),
                              in_use=cuda_in_use(), torch="torch" in sys.modules)))
        """
    )
    assert {"token": True, "ready": [], "mem": {}, "in_use": False, "torch": False} == result


@pytest.mark.slow
def test_with_torch_imported_cuda_is_never_initialised() -> None:
    """torch imported but CUDA untouched: still no-ops, and torch.cuda stays uninitialised."""
    pytest.importorskip("torch")
    result = _run(
        """
        import json, torch
        from llmtrace.gpu.cuda_timing import ForwardTimer, torch_memory_attributes
        t = ForwardTimer()
        token = t.begin()
        t.end(token)
        print(json.dumps(dict(token=token is None, ready=t.resolve_ready(), mem=torch_memory_attributes(),
                              initialised=torch.cuda.is_initialized())))
        """
    )
    assert {"token": True, "ready": [], "mem": {}, "initialised": False} == result
