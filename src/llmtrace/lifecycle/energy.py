"""GPU energy per request: each step's energy split among its requests by token share.

A step's energy comes from the GPU sampler's energy counter between the step's
start and end (``_gpu_hook.energy_j``; never an NVML call here). A request's tokens
in a step are its prompt tokens in its first step (prefill) and one afterwards;
its share of the step's energy is its tokens over the batch's. ``llm.energy_j`` on
``llm.request`` is the sum over the steps it was in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmtrace._gpu_hook import energy_j

if TYPE_CHECKING:
    from llmtrace.lifecycle.engine import StepRecord
    from llmtrace.lifecycle.request import RequestHandle


def _step_energy(step: StepRecord) -> float | None:
    if step.energy_j is None and not step.energy_done:
        step.energy_j = energy_j(step.start_ns, step.end_ns)
        step.energy_done = True  # computed once per step, whichever request asks first
    return step.energy_j


def _tokens_in(handle: RequestHandle, step: StepRecord) -> int:
    first = handle.step_records[0] if handle.step_records else None
    return max(1, handle.prompt_tokens or 1) if first is step else 1


def request_energy_j(rec: RequestHandle) -> float | None:
    """Joules attributed to *rec* over its steps, or None without GPU energy data."""
    total = 0.0
    known = False
    for step in rec.step_records:
        energy = _step_energy(step)
        if energy is None:
            continue
        # Requests in the batch without a record here (``StepRecord.size``): one token each, as a decode.
        unrecorded = max(0, step.batch_size - len(step.handles))
        batch_tokens = sum(_tokens_in(h, step) for h in step.handles) + unrecorded or 1
        total += energy * _tokens_in(rec, step) / batch_tokens
        known = True
    return total if known else None
