"""The ``os.register_at_fork`` hooks that keep every live GPU sampler fork-safe.

A leaf below :mod:`llmtrace.gpu.sampler`: samplers register themselves here, and the hooks
reach them through the :class:`ForkAware` protocol, so this module never imports the
sampler (the process singleton lives with the sampler class).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import suppress
from typing import Protocol

__all__ = ["ForkAware", "register"]


class ForkAware(Protocol):
    def _before_fork(self) -> None: ...

    def _after_fork_parent(self) -> None: ...

    def _after_fork_child(self) -> None: ...


_LIVE: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def register(sampler: ForkAware) -> None:
    """Put a sampler under the fork hooks (weakly: a dropped sampler needs no hook)."""
    _LIVE.add(sampler)


def _live() -> Iterator[ForkAware]:
    return iter(list(_LIVE))


def _before_fork() -> None:
    for sampler in _live():
        with suppress(Exception):
            sampler._before_fork()


def _after_fork_parent() -> None:
    for sampler in _live():
        with suppress(Exception):
            sampler._after_fork_parent()


def _after_fork_child() -> None:
    for sampler in _live():
        with suppress(Exception):
            sampler._after_fork_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)

