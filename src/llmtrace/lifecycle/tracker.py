"""Requests known to an engine, by id — the adapter-facing face of the lifecycle API.

An engine reports events by request id; the tracker finds the record. An id it
never saw is logged once and ignored: no exception reaches the engine loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from llmtrace import semconv
from llmtrace._safety import warn_once
from llmtrace.lifecycle.request import RequestHandle, start_request


class RequestTracker:
    """Open request records of one engine, keyed by the engine's request id."""

    def __init__(self) -> None:
        self._open: dict[str, RequestHandle] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, request_id: str, *, carrier: Mapping[str, str] | str | None = None,
            arrival_ns: int | None = None, queued_ns: int | None = None, **attrs: Any) -> RequestHandle:
        """A request reached the engine and waits in its queue (from *queued_ns*, default its arrival).

        With a *carrier* (the API server's ``llm.request``), this process adds the
        phase spans to that trace; without one, it owns an ``llm.request`` root.
        """
        handle = start_request(request_id, carrier=carrier, owns_span=not carrier, arrival_ns=arrival_ns, **attrs)
        handle.queued(arrival_ns if queued_ns is None else queued_ns)
        self._open[request_id] = handle
        return handle

    def get(self, request_id: str) -> RequestHandle | None:
        handle = self._open.get(request_id)
        if handle is None:
            warn_once(f"unknown-request:{type(self).__name__}",
                      "llmtrace: event for request id %r that the tracker never saw (ignored; "
                      "further unknown ids are not logged)", request_id)
        return handle

    def scheduled(self, request_id: str, step_id: int | None = None, at_ns: int | None = None) -> None:
        if (handle := self.get(request_id)) is not None:
            handle.scheduled(step_id, at_ns)

    def tokens(self, request_ids: Iterable[str], at_ns: int | None = None) -> None:
        """Each of these requests produced one token now (one step's output)."""
        for request_id in request_ids:
            if (handle := self.get(request_id)) is not None:
                handle.token(1, at_ns)

    def preempted(self, request_id: str, at_ns: int | None = None) -> None:
        if (handle := self.get(request_id)) is not None:
            handle.preempted(at_ns)

    def finished(self, request_id: str, reason: str = semconv.FINISH_STOP, **kwargs: Any) -> dict[str, Any]:
        """End the request; returns its :meth:`~RequestHandle.summary` for the API server."""
        handle = self._open.pop(request_id, None)
        if handle is None:
            self.get(request_id)
            return {}
        handle.finished(reason, **kwargs)
        return handle.summary()

    def aborted(self, request_id: str, error: BaseException | None = None,
                reason: str | None = None) -> dict[str, Any]:
        handle = self._open.pop(request_id, None)
        if handle is None:
            return {}
        handle.aborted(error, reason)
        return handle.summary()

    def abort_all(self, reason: str = semconv.FINISH_ABORT) -> None:
        """End every open request (the engine is shutting down or died)."""
        for request_id in list(self._open):
            self.aborted(request_id, reason=reason)
