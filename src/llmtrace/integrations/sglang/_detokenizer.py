"""DetokenizerManager side of the SGLang adapter, and the carrier on SGLang's time stats.

The detokenizer turns each ``BatchTokenIDOutput`` from the scheduler into a
``BatchStrOutput`` for the HTTP server. Its time per batch is split evenly over the
batch's requests and carried back as a duration on each request's time stats (the
detokenizer never converts clocks: durations only); the HTTP server adds them up as
``llm.detokenize.total_s``.

SGLang pickles a request's time stats with its own ``__getstate__`` (a fixed set of
keys); the hooked ``__getstate__`` adds what llmtrace carries under one more key, and
SGLang's ``__setstate__`` restores every key as an attribute on the other side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmtrace._safety import guarded
from llmtrace.integrations._targets import Hook, binder
from llmtrace.integrations.sglang import _constants as C
from llmtrace.integrations.sglang import extractors as X
from llmtrace.lifecycle.clock import monotonic_ns


def getstate_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = original(self, *args, **kwargs)
        carried = self.__dict__.get(C.CARRY_ATTR)
        if carried is not None and isinstance(state, dict):
            state = {**state, C.CARRY_ATTR: carried}
        return state

    return hook


@guarded("sglang.detokenize")
def _detokenized(output: Any, duration_ns: int) -> None:
    """Add this batch's share of detokenizer time to each request's carried values."""
    stats = getattr(output, "time_stats", None)
    if stats is None:
        return
    from sglang.srt.managers.io_struct import unwrap_from_pickle, wrap_as_pickle

    items = unwrap_from_pickle(stats)
    if not isinstance(items, list) or not items:
        return
    share = duration_ns // len(items)
    for item in items:
        X.carry(item, detokenize_ns=share)
    output.time_stats = wrap_as_pickle(items)


def detokenize_hook(original: Callable[..., Any], positions: dict[str, int]) -> Hook:
    get_recv = binder(positions, "recv_obj")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = monotonic_ns()
        output = original(self, *args, **kwargs)
        duration = monotonic_ns() - start
        if get_recv(args, kwargs) is not None:
            _detokenized(output, duration)
        return output

    return hook
