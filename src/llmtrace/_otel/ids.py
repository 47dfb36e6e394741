"""Trace and span ids from a random generator of llmtrace's own.

The SDK's ``RandomIdGenerator`` draws from the ``random`` module's shared generator, and
inference engines seed that generator for reproducible sampling: SGLang's scheduler and
vLLM's workers call ``random.seed(seed)`` in every rank with the same seed. Two data-parallel
ranks then make the same trace and span ids in the same order, and their spans merge into
one trace with duplicate span ids. This generator is seeded from ``os.urandom`` when the
module loads and again in every forked child, whatever the host does to ``random``.
"""

from __future__ import annotations

import os
import random

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID

_RNG = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_RNG.seed)
#: What the span builder calls on its fast path (the same call the SDK's generator makes).
getrandbits = _RNG.getrandbits


class PrivateRandomIdGenerator(RandomIdGenerator):
    """The SDK's random ids (W3C random trace-id flag included), drawn from :data:`getrandbits`."""

    def generate_span_id(self) -> int:
        span_id = getrandbits(64)
        while span_id == INVALID_SPAN_ID:
            span_id = getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = getrandbits(128)
        while trace_id == INVALID_TRACE_ID:
            trace_id = getrandbits(128)
        return trace_id
